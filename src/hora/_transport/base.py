"""The interface every transport (data plane) implements, and the transport of a one-rank job.

Arrays handed to a transport are 1-D and C-contiguous. Typed arrays carry the tensor's dtype (for reductions);
byte arrays are ``uint8`` views (for data that is only moved). Counts are elements for typed calls and bytes for
byte calls. Every rank calls the same methods in the same order with the same counts: the engine guarantees it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from hora._dtypes import ReduceOp, scale_into

__all__ = ["SelfTransport", "Transport"]


class Transport(ABC):
    """Moves and reduces bytes among ``size`` ranks. One instance per process, used by the engine thread only."""

    rank: int
    size: int
    #: What is running, for error messages ("allreduce 'grad.fc1'"); the engine sets it before each call.
    what: str = "collective"
    #: Whether waits may spin (holding the GIL) before yielding: the engine sets it when the waiting thread is a
    #: user thread blocked on its own collective anyway, and clears it in the background engine thread.
    eager: bool = True
    #: True where :meth:`allreduce_fused` copies the pieces straight into the transport (no packing by the caller
    #: pays off); False where it packs into a temporary, so a caller with its own fusion buffer may as well pack.
    stages_pieces: bool = False

    @abstractmethod
    def allreduce(self, src: np.ndarray, dst: np.ndarray, op: int) -> None:
        """``dst`` = reduction of every rank's ``src`` (``src`` may be ``dst``)."""

    def allreduce_fused(self, srcs: list[np.ndarray], dsts: list[np.ndarray], op: int) -> None:
        """Reduce the virtual concatenation of ``srcs`` (1-D, C-contiguous, one dtype) across ranks into ``dsts``
        (same sizes; ``dsts[i]`` may be ``srcs[i]``). Every rank passes the same sizes in the same order.

        This default packs the pieces into one temporary, reduces it with :meth:`allreduce` and unpacks it; a
        transport that can stage the pieces directly overrides it.
        """
        if len(srcs) == 1:
            self.allreduce(srcs[0], dsts[0], op)
        elif srcs:
            buf = np.concatenate(srcs)
            self.allreduce(buf, buf, op)
            at = 0
            for d in dsts:
                d[...] = buf[at : at + d.size]
                at += d.size

    def allreduce_scaled(self, src: np.ndarray, dst: np.ndarray, op: int, post: float) -> None:
        """:meth:`allreduce`, then ``dst *= post`` (Horovod's postscale; 1.0: none). A transport that can scale
        each reduced element while it is still in cache, before it leaves the transport, overrides this (the same
        multiply on the same values: the results are identical)."""
        self.allreduce(src, dst, op)
        if post != 1.0:
            scale_into(dst, post, dst)

    def allreduce_fused_scaled(self, srcs: list[np.ndarray], dsts: list[np.ndarray], op: int, post: float) -> None:
        """:meth:`allreduce_fused`, then every ``dsts[i] *= post``, as :meth:`allreduce_scaled`."""
        self.allreduce_fused(srcs, dsts, op)
        if post != 1.0:
            for d in dsts:
                scale_into(d, post, d)

    @abstractmethod
    def reducescatter(self, src: np.ndarray, dst: np.ndarray, counts: list[int], op: int) -> None:
        """Reduce every rank's ``src``; this rank receives the ``counts[rank]`` elements at its offset."""

    @abstractmethod
    def allgather(self, src: np.ndarray, dst: np.ndarray, counts: list[int]) -> None:
        """Concatenate every rank's ``src`` bytes (``counts[r]`` from rank r) into ``dst`` in rank order."""

    @abstractmethod
    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """Copy ``root``'s ``buf`` bytes into every rank's ``buf``."""

    @abstractmethod
    def alltoall(
        self, src: np.ndarray, send_counts: list[int], dst: np.ndarray, recv_counts: list[int], max_block: int
    ) -> None:
        """Send ``send_counts[r]`` bytes to rank r; receive ``recv_counts[r]`` bytes from rank r into ``dst`` in
        rank order. ``max_block`` is the largest block any rank sends any other (for transports that step)."""

    def exchange_min(self, vec: np.ndarray) -> None:
        """The engine's cycle exchange: ``vec`` (int8) becomes the elementwise minimum over ranks."""
        self.allreduce(vec, vec, ReduceOp.MIN)

    def exchange_begin(self) -> np.ndarray | None:
        """A transport that can show every rank's exchange row (shared memory) returns this rank's row to fill; then
        :meth:`exchange_end` returns all rows. Others return ``None`` and the engine uses :meth:`exchange_min`."""
        return None

    def exchange_end(self) -> np.ndarray:
        raise NotImplementedError

    def exchange_next(self) -> tuple[int, np.ndarray] | None:
        """Where the next exchange's rows are: (parity, every rank's rows), the same two arrays alternating, so a
        caller may keep views into them (the engine's express lane); None without rows."""
        return None

    def abort(self, reason: str) -> None:  # noqa: B027 - optional: a transport without peers has nothing to do
        """Make peers blocked in a collective with this rank fail quickly (this rank is giving up)."""

    @abstractmethod
    def close(self) -> None:
        """Release the transport's resources."""


class SelfTransport(Transport):
    """The transport of a job with one rank: every collective is a local copy."""

    def __init__(self) -> None:
        self.rank, self.size = 0, 1

    def allreduce(self, src: np.ndarray, dst: np.ndarray, op: int) -> None:
        if dst is not src:
            dst[...] = src

    def allreduce_fused(self, srcs: list[np.ndarray], dsts: list[np.ndarray], op: int) -> None:
        for src, dst in zip(srcs, dsts):
            if dst is not src:
                dst[...] = src

    def reducescatter(self, src: np.ndarray, dst: np.ndarray, counts: list[int], op: int) -> None:
        dst[...] = src[: counts[0]]

    def allgather(self, src: np.ndarray, dst: np.ndarray, counts: list[int]) -> None:
        dst[...] = src

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        pass

    def alltoall(
        self, src: np.ndarray, send_counts: list[int], dst: np.ndarray, recv_counts: list[int], max_block: int
    ) -> None:
        dst[...] = src

    def close(self) -> None:
        pass
