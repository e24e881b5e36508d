"""The data-plane interface every transport implements, and the reductions they share.

Arrays handed to a data plane are 1-D and C-contiguous. Typed arrays carry the tensor's dtype (for reductions);
byte arrays are ``uint8`` views (for data that is only moved). Counts are elements for typed calls and bytes for
byte calls. Every rank calls the same methods in the same order with the same counts: the engine guarantees it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import ml_dtypes
import numpy as np

from hora._engine.messages import ReduceOp

__all__ = ["DTYPES", "DTYPE_NAMES", "DataPlane", "combine", "even_counts", "offsets", "reduce_into"]

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in {
        "float16": np.float16,
        "bfloat16": ml_dtypes.bfloat16,
        "float32": np.float32,
        "float64": np.float64,
        "int8": np.int8,
        "int16": np.int16,
        "int32": np.int32,
        "int64": np.int64,
        "uint8": np.uint8,
        "bool": np.bool_,
    }.items()
}
HALF = (DTYPES["float16"], DTYPES["bfloat16"])
#: dtype -> its name in DTYPES (``np.dtype.name`` costs microseconds per call in numpy 2)
DTYPE_NAMES: dict[np.dtype, str] = {dt: name for name, dt in DTYPES.items()}

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def reduce_into(acc: np.ndarray, x: np.ndarray, op: int) -> None:
    """``acc = acc (op) x`` elementwise, in place. For bool, Sum/Max are OR and Product/Min are AND."""
    _UFUNCS[ReduceOp(op)](acc, x, out=acc)


def combine(a: np.ndarray, b: np.ndarray, out: np.ndarray, op: int) -> None:
    """``out = a (op) b`` elementwise."""
    _UFUNCS[ReduceOp(op)](a, b, out=out)


def even_counts(n: int, parts: int) -> list[int]:
    """Split ``n`` items into ``parts`` counts as evenly as possible, the first ranks taking one more."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def offsets(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


class DataPlane(ABC):
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
        """A plane that can show every rank's exchange row (shared memory) returns this rank's row to fill; then
        :meth:`exchange_end` returns all rows. Others return ``None`` and the engine uses :meth:`exchange_min`."""
        return None

    def exchange_end(self) -> np.ndarray:
        raise NotImplementedError

    def abort(self, reason: str) -> None:  # noqa: B027 - optional: a transport without peers has nothing to do
        """Make peers blocked in a collective with this rank fail quickly (this rank is giving up)."""

    @abstractmethod
    def close(self) -> None:
        """Release the transport's resources."""


class SelfPlane(DataPlane):
    """The data plane of a job with one rank: every collective is a local copy."""

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
