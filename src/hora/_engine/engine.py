"""The background engine: one thread per process that negotiates and executes every collective.

User threads call :meth:`Engine.enqueue`, which records the request and wakes the engine thread. The engine
thread sends new requests to the coordinator (rank 0, which runs its part in the same thread), receives the
ordered responses, and executes them on the data plane, completing handles. Negotiation is event-driven: a
request goes out as soon as it is enqueued and a response as soon as the tensor is ready on every rank.

Control messages are JSON frames on authenticated sockets:

    worker -> coordinator   ["req", [request, ...]]   ["bye", [reason]]
    coordinator -> worker   ["resp", [response, ...]] ["abort", [message]]   ["bye", [reason]]

A data-plane failure (a peer died, a timeout) is fatal for the job: the engine fails every pending handle, makes
its peers fail fast (shm abort word / closed sockets / "abort" message) and refuses later collectives.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
from collections import deque
from collections.abc import Iterable

from hora._engine.execute import execute
from hora._engine.handle import Entry
from hora._engine.messages import Request, Response, decode, encode
from hora._engine.negotiation import Coordinator
from hora._runtime.auth import recv_frame, send_frame
from hora._transport.base import DataPlane
from hora.errors import (
    CollectiveError,
    HoraError,
    HoraInternalError,
    MismatchError,
    PeerLostError,
    ShutdownError,
)

__all__ = ["Engine"]

log = logging.getLogger(__name__)

_ERRORS: dict[str, type[CollectiveError]] = {
    "mismatch": MismatchError,
    "duplicate": MismatchError,
    "shutdown": ShutdownError,
    "join": CollectiveError,
}


class Engine:
    """Owns the engine thread, the control connections and the data plane of one process."""

    def __init__(
        self,
        rank: int,
        size: int,
        plane: DataPlane,
        control: dict[int, socket.socket],
        max_frame_bytes: int,
        describe_rank: dict[int, str] | None = None,
    ) -> None:
        self.rank, self.size = rank, size
        self._plane = plane
        self._control = dict(control)  # rank 0: every worker's socket; workers: {0: coordinator socket}
        self._max_frame = max_frame_bytes
        self._describe = describe_rank or {}
        self._coordinator = Coordinator(size) if rank == 0 else None
        self._lock = threading.Lock()
        self._queue: deque[Entry] = deque()
        self._pending: dict[str, Entry] = {}
        self._failed: HoraError | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        for peer, sock in self._control.items():
            sock.settimeout(60.0)
            self._sel.register(sock, selectors.EVENT_READ, peer)
        self._thread = threading.Thread(target=self._run, name=f"hora-engine-{rank}", daemon=True)

    # -- user-thread API ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def enqueue(self, entries: Iterable[Entry]) -> None:
        """Submit entries atomically (a group either all goes in or none does)."""
        entries = list(entries)
        with self._lock:
            if self._failed is not None:
                raise type(self._failed)(str(self._failed))
            if self._stopping:
                raise ShutdownError("hora is shutting down on this rank; no new collective can start")
            names = [e.request.name for e in entries]
            taken = [n for n in names if n in self._pending]
            if taken or len(set(names)) < len(names):
                dup = taken[0] if taken else next(n for n in names if names.count(n) > 1)
                raise MismatchError(
                    f"a collective named '{dup}' is already in flight on rank {self.rank}; names must be unique "
                    "among pending collectives (synchronize the first one, or pick another name)"
                )
            for e in entries:
                self._pending[e.request.name] = e
            self._queue.extend(entries)
        self._wake()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("hora engine thread did not stop within %gs", timeout)
            return
        self._plane.close()
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed

    # -- engine thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                for key, _ in self._sel.select(timeout=1.0):
                    if key.data is None:
                        try:
                            while os.read(self._wake_r, 4096):
                                pass
                        except BlockingIOError:
                            pass
                    elif key.fileobj in self._control.values():
                        self._on_control(key.data, key.fileobj)  # type: ignore[arg-type]
                with self._lock:
                    new, self._queue = list(self._queue), deque()
                    stopping = self._stopping
                if stopping:
                    self._stop()
                    return
                if new:
                    self._submit([e.request for e in new])
                if self._coordinator is not None:
                    self._dispatch(self._coordinator.take())
        except HoraError as exc:
            self._fail(exc)
        except OSError as exc:  # a control connection broke while sending (the reads report it themselves)
            self._fail(PeerLostError(f"rank {self.rank} lost its control connection: {exc}"))
        except Exception as exc:  # a bug: still fail every handle rather than hang the user
            log.exception("hora engine crashed")
            self._fail(HoraInternalError(f"the hora engine on rank {self.rank} crashed: {exc!r}"))

    def _submit(self, requests: list[Request]) -> None:
        if self._coordinator is not None:
            self._coordinator.submit(0, requests)
        else:
            self._send(0, "req", [r.to_wire() for r in requests])

    def _send(self, peer: int, kind: str, payload: list) -> None:
        send_frame(self._control[peer], encode(kind, payload))

    def _dispatch(self, responses: list[Response]) -> None:
        """Coordinator: send the responses to every worker, then execute them here in the same order."""
        if not responses:
            return
        wire = [r.to_wire() for r in responses]
        for peer in list(self._control):
            try:
                self._send(peer, "resp", wire)
            except OSError:
                pass  # its EOF is handled when the selector reports it
        for r in responses:
            self._execute(r)

    def _on_control(self, peer: int, sock: socket.socket) -> None:
        try:
            kind, payload = decode(recv_frame(sock, self._max_frame, self._who(peer)))
        except (HoraError, OSError, ValueError) as exc:
            self._peer_gone(peer, f"{self._who(peer)} closed its connection unexpectedly ({exc})")
            return
        if kind == "req" and self._coordinator is not None:
            self._coordinator.submit(peer, [Request.from_wire(w) for w in payload])
        elif kind == "resp" and self._coordinator is None:
            for w in payload:
                self._execute(Response.from_wire(w))
        elif kind == "bye":
            self._drop(peer)
            reason = f"{self._who(peer)} called shutdown()"
            if self._coordinator is not None:
                self._coordinator.leave(peer, reason)
            else:
                self._fail(
                    ShutdownError(f"{reason}; no collective can run after the coordinator shut down"),
                    quiet=True,
                )
        elif kind == "abort":
            raise PeerLostError(str(payload[0]))
        else:
            raise HoraInternalError(f"unexpected control message {kind!r} from {self._who(peer)}")

    def _peer_gone(self, peer: int, message: str) -> None:
        self._drop(peer)
        raise PeerLostError(message)

    def _drop(self, peer: int) -> None:
        sock = self._control.pop(peer, None)
        if sock is not None:
            self._sel.unregister(sock)
            sock.close()

    def _who(self, peer: int) -> str:
        return self._describe.get(peer, f"rank {peer}")

    def _execute(self, resp: Response) -> None:
        name = resp.request.name
        with self._lock:
            entry = self._pending.pop(name, None)
        if resp.error is not None:
            if entry is not None:
                entry.handle._set_error(_ERRORS.get(resp.error_kind, CollectiveError)(resp.error))
            return
        if entry is None and self.rank not in resp.joined and resp.request.kind.value != "join":
            raise HoraInternalError(f"rank {self.rank} got a response for '{name}', which it never submitted")
        try:
            result = execute(self._plane, resp, entry)
        except HoraError as exc:
            if entry is not None:
                entry.handle._set_error(exc)
            raise
        if entry is not None:
            entry.handle._set_result(result)

    # -- failure and shutdown ---------------------------------------------------------------------------------------
    def _fail(self, error: HoraError, quiet: bool = False) -> None:
        """Fail every pending handle with ``error``; make peers fail fast; refuse later collectives."""
        with self._lock:
            if self._failed is None:
                self._failed = error
            pending, self._pending = list(self._pending.values()), {}
            self._queue.clear()
        for e in pending:
            e.handle._set_error(type(error)(str(error)))
        if quiet:
            return
        self._plane.abort(str(error))
        for peer in list(self._control):
            if self._coordinator is not None:
                try:
                    self._send(peer, "abort", [f"rank 0 (the coordinator) failed: {error}"])
                except OSError:
                    pass
            self._drop(peer)

    def _stop(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for e in pending:
            e.handle._set_error(
                ShutdownError(
                    f"'{e.request.name}' was still pending when hora was shut down on rank {self.rank}"
                )
            )
        for peer in list(self._control):
            try:
                self._send(peer, "bye", [f"rank {self.rank} shut down"])
            except OSError:
                pass
            self._drop(peer)
