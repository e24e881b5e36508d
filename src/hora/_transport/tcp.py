"""TCP transport: bandwidth-optimal ring collectives over a full mesh of authenticated connections.

Allreduce is a ring reduce-scatter followed by a ring allgather; every step sends one segment to the next rank
while receiving another from the previous one. Sending runs on a helper thread and receiving on the engine thread
(both release the GIL in the socket calls and numpy reductions), and the received segment is reduced piece by
piece as it arrives, so network and arithmetic overlap. Receives go straight into preallocated buffers with
``recv_into``; nothing is allocated per piece.
"""

from __future__ import annotations

import builtins
import socket
import threading
from collections import deque

import numpy as np

from hora._dtypes import even_counts, offsets, reduce_into
from hora._transport.base import Transport
from hora._wire import recv_into_exact
from hora.errors import CollectiveTimeoutError, PeerLostError

__all__ = ["TcpTransport"]


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a.view(np.uint8))  # type: ignore[arg-type]


class _Sender:
    """A thread that performs ``sendall`` calls in submission order, so the caller can receive meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[tuple[socket.socket, memoryview, int]] = deque()
        self._busy = 0
        self._error: tuple[int, BaseException] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hora-tcp-sender", daemon=True)
        self._thread.start()

    def submit(self, sock: socket.socket, view: memoryview, peer: int) -> None:
        if len(view) == 0:
            return
        with self._cond:
            self._queue.append((sock, view, peer))
            self._busy += 1
            self._cond.notify_all()

    def wait(self) -> None:
        """Block until every submitted send finished; re-raise the first send error as (peer, exception)."""
        with self._cond:
            while self._busy and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise _SendFailed(*self._error)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                sock, view, peer = self._queue.popleft()
            try:
                if self._error is None:
                    _send_all(sock, view)
            except BaseException as exc:  # reported to the engine thread through wait()
                with self._cond:
                    self._error = (peer, exc)
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join(timeout=5)


def _send_all(sock: socket.socket, view: memoryview) -> None:
    """``sendall``, but the socket's timeout bounds each wait for progress, not the whole send: a big segment on
    a slow but healthy link takes as long as it takes (``socket.sendall`` counts the timeout over all of it)."""
    sent, n = 0, len(view)
    while sent < n:
        sent += sock.send(view[sent:])


class _SendFailed(Exception):
    def __init__(self, peer: int, exc: BaseException) -> None:
        super().__init__(peer, exc)
        self.peer, self.exc = peer, exc


class TcpTransport(Transport):
    """Ring collectives over ``socks`` (peer rank -> connected, authenticated socket)."""

    def __init__(
        self,
        rank: int,
        size: int,
        socks: dict[int, socket.socket],
        chunk_bytes: int,
        op_timeout: float,
        labels: dict[int, str] | None = None,
    ) -> None:
        self.rank, self.size = rank, size
        # how messages name each peer (a lane's peers are ranks of the whole job)
        self._who = {p: (labels or {}).get(p) or f"rank {p}" for p in socks}
        self._socks = socks
        self._chunk = max(4096, chunk_bytes)
        self._timeout = op_timeout
        for s in socks.values():
            s.settimeout(op_timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sender = _Sender()
        self._scratch = np.empty(0, np.uint8)
        self._next = (rank + 1) % size
        self._prev = (rank - 1) % size

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _send(self, peer: int, a: np.ndarray) -> None:
        self._sender.submit(self._socks[peer], _bytes(a), peer)

    def _recv(self, peer: int, a: np.ndarray) -> None:
        if a.size:
            try:
                recv_into_exact(self._socks[peer], _bytes(a), self._who[peer])
            except builtins.TimeoutError:
                raise CollectiveTimeoutError(
                    f"{self.what}: no bytes from {self._who[peer]} for {self._timeout:g}s over TCP (link down or "
                    "peer stuck; raise HORA_OP_TIMEOUT_SECONDS if it is just slow)"
                ) from None
            except PeerLostError as exc:
                raise PeerLostError(f"{self._who[peer]} left during {self.what}: {exc}") from None

    def _wait_sends(self) -> None:
        try:
            self._sender.wait()
        except _SendFailed as failed:
            if isinstance(failed.exc, socket.timeout):
                raise CollectiveTimeoutError(
                    f"{self.what}: no bytes went to {self._who[failed.peer]} for {self._timeout:g}s over TCP (link "
                    "down or peer stuck; raise HORA_OP_TIMEOUT_SECONDS if it is just slow)"
                ) from None
            raise PeerLostError(
                f"{self._who[failed.peer]} left during {self.what} (send failed: {failed.exc})"
            ) from None

    def _scratch_for(self, dtype: np.dtype, n: int) -> np.ndarray:
        need = n * dtype.itemsize
        if self._scratch.size < need:
            self._scratch = np.empty(need, np.uint8)
        return self._scratch[:need].view(dtype)

    # -- ring building blocks ------------------------------------------------------------------------------------
    def _ring_reduce_scatter(self, work: np.ndarray, counts: list[int], op: int) -> None:
        """After this, ``work``'s segment ``rank`` holds the reduction of every rank's segment ``rank``."""
        n, me = self.size, self.rank
        offs = offsets(counts)
        piece = max(1, self._chunk // work.dtype.itemsize)
        scratch = self._scratch_for(work.dtype, min(piece, max(counts)))
        for t in range(n - 1):
            s, r = (me - t - 1) % n, (me - t - 2) % n
            self._send(self._next, work[offs[s] : offs[s] + counts[s]])
            seg = work[offs[r] : offs[r] + counts[r]]
            for lo in range(0, counts[r], piece):
                m = min(piece, counts[r] - lo)
                self._recv(self._prev, scratch[:m])
                reduce_into(seg[lo : lo + m], scratch[:m], op)
            self._wait_sends()

    def _ring_allgather(self, buf: np.ndarray, counts: list[int]) -> None:
        """``buf`` (bytes) holds this rank's segment; afterwards it holds every rank's."""
        n, me = self.size, self.rank
        offs = offsets(counts)
        for t in range(n - 1):
            s, r = (me - t) % n, (me - t - 1) % n
            self._send(self._next, buf[offs[s] : offs[s] + counts[s]])
            self._recv(self._prev, buf[offs[r] : offs[r] + counts[r]])
            self._wait_sends()

    # -- collectives ----------------------------------------------------------------------------------------------
    def allreduce(self, src: np.ndarray, dst: np.ndarray, op: int) -> None:
        if dst is not src:
            dst[...] = src
        counts = even_counts(dst.size, self.size)
        self._ring_reduce_scatter(dst, counts, op)
        self._ring_allgather(dst.view(np.uint8), [c * dst.dtype.itemsize for c in counts])

    def reducescatter(self, src: np.ndarray, dst: np.ndarray, counts: list[int], op: int) -> None:
        work = src.copy()
        self._ring_reduce_scatter(work, counts, op)
        start = offsets(counts)[self.rank]
        dst[...] = work[start : start + counts[self.rank]]

    def allgather(self, src: np.ndarray, dst: np.ndarray, counts: list[int]) -> None:
        start = offsets(counts)[self.rank]
        dst[start : start + counts[self.rank]] = src
        self._ring_allgather(dst, counts)

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        last = (self.rank - root) % self.size == self.size - 1
        for lo in range(0, buf.size, self._chunk):
            piece = buf[lo : lo + self._chunk]
            if self.rank != root:
                self._recv(self._prev, piece)
            if not last:
                self._send(self._next, piece)
        self._wait_sends()

    def alltoall(
        self, src: np.ndarray, send_counts: list[int], dst: np.ndarray, recv_counts: list[int], max_block: int
    ) -> None:
        n, me = self.size, self.rank
        sd, rd = offsets(send_counts), offsets(recv_counts)
        dst[rd[me] : rd[me] + recv_counts[me]] = src[sd[me] : sd[me] + send_counts[me]]
        for t in range(1, n):
            to, frm = (me + t) % n, (me - t) % n
            self._send(to, src[sd[to] : sd[to] + send_counts[to]])
            self._recv(frm, dst[rd[frm] : rd[frm] + recv_counts[frm]])
            self._wait_sends()

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        # Closing makes every peer blocked on this rank see EOF at once, so failures cascade instead of hanging.
        for s in self._socks.values():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._sender.close()
        for s in self._socks.values():
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            s.close()
        self._socks = {}
