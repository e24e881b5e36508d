"""The background engine: one per process, negotiating and executing every collective in lockstep cycles.

User threads call :meth:`Engine.enqueue`; the engine runs *cycles*. Every rank runs the same sequence of
cycles, and each cycle starts with one small collective over the data plane, the **exchange**: an ``int8``
vector reduced with ``MIN`` across ranks, so that a field written as ``1`` becomes an AND and a field written as
``-1`` becomes an OR:

    [0, C)        cached requests ready on this rank (AND: ready everywhere)    C = HORA_CACHE_CAPACITY
    [C, 2C)       cache slots this rank invalidates (OR)
    FULL          this rank needs a full negotiation round (OR)
    JOINED        this rank has called join() (OR)
    BUSY          this rank has collectives in flight (OR; idle engines slow down when nobody is busy)
    BYE + r       rank r is shutting down (OR)

A collective seen before is in the **response cache** (``cache.py``) under the same slot on every rank; after
the exchange, the slots ready everywhere run straight away, in slot order: no message goes through rank 0.
Anything else (a new name, a changed shape, a join, a tensor the stall inspector wants to see) takes a **full
round**: every worker sends its new requests to the coordinator on rank 0 over its authenticated control
connection, and rank 0 answers every rank with the same list of responses (JSON, never pickles):

    worker -> coordinator   ["req", [request, ...]]
    coordinator -> worker   ["resp", [[response, ...], fatal_message_or_null]]

The responses of a cycle are grouped by **fusion** (``fusion.py``) and executed on the data plane; every rank
computes the same groups from the same list, so every rank calls the data plane in the same order.

Rank 0 also runs the **stall inspector**: collectives that some ranks submitted and others did not for longer
than HORA_STALL_CHECK_TIME_SECONDS are reported (one line per missing rank), and past
HORA_STALL_SHUTDOWN_TIME_SECONDS every rank fails with StallError. A cached request waiting alone for half the
check time is invalidated, which sends it (on every rank) through the coordinator, so the inspector sees it.

A data-plane failure (a peer died, a timeout) is fatal for the job: the engine fails every pending handle, makes
its peers fail fast (shm abort word / closed sockets) and refuses later collectives. A rank that shuts down sets
its BYE bit; every rank then fails what is pending with ShutdownError and stops cycling.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from hora._engine.cache import ResponseCache, cacheable
from hora._engine.execute import _phase, execute, execute_fused
from hora._engine.fusion import plan
from hora._engine.handle import Entry, Handle
from hora._engine.messages import Kind, ReduceOp, Request, Response, decode, encode
from hora._engine.negotiation import Coordinator, format_ranks
from hora._engine.timeline import Timeline
from hora._runtime.auth import recv_frame, send_frame
from hora._transport.base import DataPlane
from hora.errors import (
    CollectiveError,
    HoraError,
    HoraInternalError,
    MismatchError,
    PeerLostError,
    ShutdownError,
    StallError,
    TimeoutError,
)

__all__ = ["Engine", "EngineSettings"]

log = logging.getLogger("hora")

_ERRORS: dict[str, type[CollectiveError]] = {
    "mismatch": MismatchError,
    "duplicate": MismatchError,
    "shutdown": ShutdownError,
    "join": CollectiveError,
    "stall": StallError,
}

_IDLE_MAX = 0.02  # the longest pause between cycles when no rank has anything in flight


class EngineSettings:
    """The settings the engine reads (a subset of :class:`hora.config.Config`)."""

    def __init__(self, config: Any) -> None:
        self.max_frame_bytes: int = config.max_frame_bytes
        self.op_timeout: float = config.op_timeout
        self.fusion_threshold: int = config.fusion_threshold
        self.cycle_time: float = config.cycle_time_ms / 1000.0
        self.cache_capacity: int = config.cache_capacity
        self.stall_check: bool = not config.stall_check_disable
        self.stall_check_time: float = config.stall_check_time
        self.stall_shutdown_time: float = config.stall_shutdown_time
        self.timeline: str = config.timeline
        self.timeline_mark_cycles: bool = config.timeline_mark_cycles


class Engine:
    """Owns the engine thread, the control connections and the data plane of one process."""

    def __init__(
        self,
        rank: int,
        size: int,
        plane: DataPlane,
        control: dict[int, socket.socket],
        settings: EngineSettings,
        describe_rank: dict[int, str] | None = None,
    ) -> None:
        self.rank, self.size = rank, size
        self._plane = plane
        self._control = dict(control)  # rank 0: every worker's socket; workers: {0: coordinator socket}
        self._s = settings
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
        for sock in self._control.values():
            sock.settimeout(settings.op_timeout)
        # cycle state (engine thread only)
        cap = settings.cache_capacity
        self._cache = ResponseCache(cap) if cap > 0 else None
        self._cached_ready: dict[int, Entry] = {}  # slot -> entry waiting for the AND
        self._uncached: list[Entry] = []  # to send to the coordinator in the next full round
        self._invalid: set[int] = set()
        self._joined = False
        self._stall_fatal: str | None = None
        self._next_stall_check = 0.0
        self._warned: dict[str, float] = {}
        c = cap
        self._FULL, self._JOINED, self._BUSY, self._BYE = 2 * c, 2 * c + 1, 2 * c + 2, 2 * c + 3
        self._vec = np.zeros(2 * c + 3 + size, np.int8)
        self._idle = settings.cycle_time
        self._timeline: Timeline | None = None
        if rank == 0 and settings.timeline:
            self._timeline = Timeline(settings.timeline, settings.timeline_mark_cycles)
        self._drive = threading.Lock()  # held by whichever thread runs a cycle
        self._cycling = True
        self._user_drivers = 0
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
            now = time.monotonic()
            for e in entries:
                e.queued_at = now
                e.handle._driver = self._drive_until
                self._pending[e.request.name] = e
            self._queue.extend(entries)
        self._wake()

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Start writing a timeline (rank 0 writes; other ranks only record that one is on)."""
        timeline = Timeline(path, mark_cycles) if self.rank == 0 else None
        with self._lock:
            old, self._timeline = self._timeline, timeline
        if old is not None:
            old.close()

    def stop_timeline(self) -> None:
        with self._lock:
            old, self._timeline = self._timeline, None
        if old is not None:
            old.close()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("hora engine thread did not stop within %gs", timeout)
            return
        self.stop_timeline()
        self._plane.close()
        for peer in list(self._control):
            self._drop(peer)
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
        while True:
            self._pause()
            with self._drive:
                if not self._cycling:
                    return
                with self._lock:
                    deferring = self._user_drivers > 0
                if not deferring:
                    self._guarded_cycle()

    def _guarded_cycle(self) -> None:
        """Run one cycle (in the engine thread or in a user thread waiting for its handle); on failure, fail
        every handle and stop cycling."""
        try:
            if not self._cycle():
                self._cycling = False
        except HoraError as exc:
            self._cycling = False
            self._fail(exc)
        except OSError as exc:  # a control connection broke
            self._cycling = False
            self._fail(PeerLostError(f"rank {self.rank} lost its control connection during negotiation: {exc}"))
        except Exception as exc:  # a bug: still fail every handle rather than hang the user
            self._cycling = False
            log.exception("hora engine crashed")
            self._fail(HoraInternalError(f"the hora engine on rank {self.rank} crashed: {exc!r}"))

    def _drive_until(self, handle: Handle, timeout: float | None) -> None:
        """A user thread waiting for ``handle`` runs the cycles itself: no hand-off to the engine thread and back,
        which is most of a small collective's latency. Returns when the handle is done, at the deadline, or when
        the engine stopped (the handle is then failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._user_drivers += 1
        try:
            while not handle.done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                if not self._drive.acquire(timeout=-1 if left is None else left):
                    return
                try:
                    if handle.done() or not self._cycling:
                        return
                    self._guarded_cycle()
                finally:
                    self._drive.release()
        finally:
            with self._lock:
                self._user_drivers -= 1
                more = bool(self._pending)
            if more:
                self._wake()  # the engine thread takes over what is still in flight

    def _pause(self) -> None:
        """Wait for local work, at most the idle period. Work in flight goes straight to the next exchange, which
        waits for the peers itself."""
        with self._lock:
            busy = (bool(self._pending) and self._user_drivers == 0) or self._stopping
        if not busy:
            select.select([self._wake_r], [], [], self._idle)
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _cycle(self) -> bool:
        """One cycle; False once this engine stops cycling (a rank shut down)."""
        with self._lock:
            new, self._queue = self._queue, deque()
            stopping = self._stopping
            busy = bool(self._pending)
            timeline = self._timeline
        now = time.monotonic()
        for e in new:
            self._classify(e)
        vec, cap = self._vec, self._s.cache_capacity
        vec[:] = 0
        if self._cached_ready:
            if self._s.stall_check:
                half = self._s.stall_check_time / 2
                self._invalid.update(s for s, e in self._cached_ready.items() if now - e.queued_at > half)
            vec[list(self._cached_ready)] = 1
        if self._invalid:
            vec[[cap + s for s in self._invalid]] = -1
            self._invalid.clear()
        if self._uncached or self._stall_fatal is not None:
            vec[self._FULL] = -1
        if self._joined:
            vec[self._JOINED] = -1
        if busy:
            vec[self._BUSY] = -1
        if stopping:
            vec[self._BYE + self.rank] = -1
        self._plane.what = "hora's negotiation exchange"
        self._plane.allreduce(vec, vec, ReduceOp.MIN)

        byes = [r for r in range(self.size) if vec[self._BYE + r]]
        if byes:
            self._on_bye(byes, stopping)
            return False
        self._idle = self._s.cycle_time if vec[self._BUSY] else min(max(self._idle, 1e-3) * 2, _IDLE_MAX)
        if timeline is not None and vec[self._BUSY]:
            timeline.mark_cycle()

        ready: list[tuple[Response, Entry | None]] = []
        if cap:
            assert self._cache is not None
            for slot in np.flatnonzero(vec[cap : 2 * cap]).tolist():
                self._cache.evict(slot)
                self._demote(slot)
            if vec[self._JOINED]:  # while a rank is joined, everything goes through the coordinator
                for slot in list(self._cached_ready):
                    self._demote(slot)
            for slot in np.flatnonzero(vec[:cap] > 0).tolist():
                entry = self._cached_ready.pop(slot)
                self._cache.touch(slot)
                ready.append((self._cache.response(slot), entry))
        if vec[self._FULL]:
            ready.extend(self._full_round(timeline))
        if ready:
            self._execute_all(ready, timeline)
        if self.rank == 0 and self._s.stall_check:
            self._inspect_stalls(now)
        return True

    def _classify(self, entry: Entry) -> None:
        req = entry.request
        if req.kind is Kind.JOIN:
            self._joined = True
        elif self._cache is not None:
            slot, hit = self._cache.lookup(req)
            if hit:
                self._cached_ready[slot] = entry
                return
            if slot >= 0:  # known name, new shape (or dtype, op, ...): every rank forgets the slot
                self._invalid.add(slot)
        self._uncached.append(entry)

    def _demote(self, slot: int) -> None:
        entry = self._cached_ready.pop(slot, None)
        if entry is not None:
            self._uncached.append(entry)

    # -- full negotiation round ---------------------------------------------------------------------------------
    def _full_round(self, timeline: Timeline | None) -> list[tuple[Response, Entry | None]]:
        requests = [e.request for e in self._uncached]
        self._uncached = []
        if self._coordinator is not None:
            self._submit(0, requests, timeline)
            for peer in sorted(self._control):
                kind, payload = self._recv(peer, "its requests")
                if kind != "req":
                    raise HoraInternalError(f"expected requests from {self._who(peer)}, got {kind!r}")
                self._submit(peer, [Request.from_wire(w) for w in payload], timeline)
            responses = self._coordinator.take()
            fatal, self._stall_fatal = self._stall_fatal, None
            message = encode("resp", [[r.to_wire() for r in responses], fatal])
            for peer in sorted(self._control):
                send_frame(self._control[peer], message)
            if timeline is not None:
                for r in responses:
                    timeline.negotiate_end(r.request.name)
        else:
            send_frame(self._control[0], encode("req", [r.to_wire() for r in requests]))
            kind, payload = self._recv(0, "the negotiated responses")
            if kind == "abort":
                raise PeerLostError(str(payload[0]))
            if kind != "resp" or len(payload) != 2:
                raise HoraInternalError(f"expected responses from the coordinator, got {kind!r}")
            responses = [Response.from_wire(w) for w in payload[0]]
            fatal = payload[1]
        if fatal is not None:
            raise StallError(str(fatal))
        out: list[tuple[Response, Entry | None]] = []
        for resp in responses:
            with self._lock:
                entry = self._pending.get(resp.request.name)
            out.append((resp, entry))
            if self._cache is not None and entry is not None and cacheable(resp):
                evicted = self._cache.put(resp, entry.request)
                if evicted is not None:
                    self._demote(evicted)
            if resp.request.kind is Kind.JOIN and resp.error is None:
                self._joined = False
        return out

    def _submit(self, peer: int, requests: list[Request], timeline: Timeline | None) -> None:
        assert self._coordinator is not None
        if timeline is not None:
            for r in requests:
                if r.kind is not Kind.JOIN and not self._coordinator.waiting(r.name):
                    timeline.negotiate_start(r.name, r.kind.value)
                timeline.negotiate_rank_ready(r.name, peer)
        self._coordinator.submit(peer, requests)

    def _recv(self, peer: int, what: str) -> tuple[str, list]:
        try:
            return decode(recv_frame(self._control[peer], self._s.max_frame_bytes, self._who(peer)))
        except builtins.TimeoutError:
            raise TimeoutError(
                f"rank {self.rank} waited {self._s.op_timeout:g}s for {what} from {self._who(peer)} during "
                "negotiation; the peer is alive but stuck (raise HORA_OP_TIMEOUT_SECONDS if it is just slow)"
            ) from None
        except (HoraError, OSError, ValueError) as exc:
            self._drop(peer)
            raise PeerLostError(
                f"{self._who(peer)} closed its control connection during negotiation ({exc})"
            ) from None

    # -- execution -------------------------------------------------------------------------------------------
    def _execute_all(self, ready: list[tuple[Response, Entry | None]], timeline: Timeline | None) -> None:
        responses = [r for r, _ in ready]
        for group in plan(responses, self._s.fusion_threshold):
            items = [ready[i] for i in group]
            names = [r.request.name for r, _ in items]
            with self._lock:
                for n in names:
                    self._pending.pop(n, None)
            if timeline is not None:
                for r, _ in items:
                    timeline.start(r.request.name, r.request.kind.value, _args(r.request))
            try:
                if len(items) == 1:
                    self._execute_one(*items[0], timeline)
                else:
                    self._execute_group(items, timeline)
            finally:
                if timeline is not None:
                    for n in names:
                        timeline.end(n)

    def _execute_one(self, resp: Response, entry: Entry | None, timeline: Timeline | None) -> None:
        if resp.error is not None:
            if entry is not None:
                entry.handle._set_error(_ERRORS.get(resp.error_kind, CollectiveError)(resp.error))
            return
        name = resp.request.name
        if entry is None and self.rank not in resp.joined and resp.request.kind is not Kind.JOIN:
            raise HoraInternalError(f"rank {self.rank} got a response for '{name}', which it never submitted")
        try:
            with _phase(timeline, [name], self._transport_activity(resp.request.kind)):
                result = execute(self._plane, resp, entry)
        except HoraError as exc:
            if entry is not None:
                entry.handle._set_error(exc)
            raise
        if entry is not None:
            entry.handle._set_result(result)

    def _execute_group(self, items: list[tuple[Response, Entry | None]], timeline: Timeline | None) -> None:
        entries: list[Entry] = []
        for resp, entry in items:
            if entry is None:  # fused responses have no joined ranks, so every rank has every entry
                raise HoraInternalError(f"rank {self.rank} has no entry for fused '{resp.request.name}'")
            entries.append(entry)
        try:
            results = execute_fused(
                self._plane, [r for r, _ in items], entries, timeline, self._transport_activity(Kind.ALLREDUCE)
            )
        except HoraError as exc:
            for e in entries:
                e.handle._set_error(exc)
            raise
        for e, result in zip(entries, results):
            e.handle._set_result(result)

    def _transport_activity(self, kind: Kind) -> str:
        return f"{type(self._plane).__name__.removesuffix('Plane').upper()}_{kind.value.upper()}"  # SHM_ALLREDUCE

    # -- stall inspector (rank 0) --------------------------------------------------------------------------------
    def _inspect_stalls(self, now: float) -> None:
        if now < self._next_stall_check or self._stall_fatal is not None:
            return
        check, stop = self._s.stall_check_time, self._s.stall_shutdown_time
        self._next_stall_check = now + min(check, stop or check) / 10
        assert self._coordinator is not None
        joined = set(self._coordinator.joined)
        stalled = {n: (t, rs) for n, (t, rs) in self._coordinator.pending().items() if t > check}
        self._warned = {n: t for n, t in self._warned.items() if n in stalled}
        if not stalled:
            return
        missing: dict[int, list[str]] = {}
        for name, (_, ranks) in sorted(stalled.items()):
            for r in range(self.size):
                if r not in ranks and r not in joined:
                    missing.setdefault(r, []).append(name)
        due = [n for n in stalled if now - self._warned.get(n, -1e18) >= check]
        if due:
            for n in due:
                self._warned[n] = now
            lines = "\n".join(f"{r}: [{', '.join(names)}]" for r, names in sorted(missing.items()))
            log.warning(
                "Stalled collectives: %d waited more than %gs for other ranks. This may indicate that different "
                "ranks are trying to submit different tensors or that only a subset of ranks is submitting "
                "tensors, which will cause deadlock.\nMissing ranks:\n%s",
                len(stalled),
                check,
                lines,
            )
        if stop > 0:
            over = sorted(n for n, (t, _) in stalled.items() if t > stop)
            if over:
                who = "; ".join(
                    f"{format_ranks(rs)} never submitted {', '.join(repr(n) for n in ns)}"
                    for rs, ns in _group_missing(missing, set(over))
                )
                self._stall_fatal = (
                    f"stalled: {len(over)} collective(s) waited more than {stop:g}s "
                    f"(HORA_STALL_SHUTDOWN_TIME_SECONDS): {who}. Every rank must submit the same collectives; "
                    "check for a rank that skips a step or names a tensor differently."
                )

    # -- failure and shutdown ---------------------------------------------------------------------------------------
    def _on_bye(self, byes: list[int], me_too: bool) -> None:
        others = [r for r in byes if r != self.rank]
        if others:
            reason = f"{format_ranks(others)} called shutdown()"
            error: HoraError = ShutdownError(
                f"{reason}; no collective can run after a rank shut down (call shutdown() on every rank)"
            )
        else:
            error = ShutdownError(f"hora was shut down on rank {self.rank}")
        with self._lock:
            if self._failed is None and not me_too:
                self._failed = error
            pending, self._pending = list(self._pending.values()), {}
            self._queue.clear()
        for e in pending:
            e.handle._set_error(
                ShutdownError(f"{e.request.kind.value} '{e.request.name}' cannot complete: {error}")
            )

    def _fail(self, error: HoraError) -> None:
        """Fail every pending handle with ``error``; make peers fail fast; refuse later collectives."""
        with self._lock:
            if self._failed is None:
                self._failed = error
            pending, self._pending = list(self._pending.values()), {}
            self._queue.clear()
        for e in pending:
            e.handle._set_error(type(error)(str(error)))
        if isinstance(error, StallError):
            return  # every rank got the same verdict in the same round
        self._plane.abort(str(error))
        for peer in list(self._control):
            if self._coordinator is not None:
                with contextlib.suppress(OSError):
                    send_frame(self._control[peer], encode("abort", [f"rank 0 (the coordinator) failed: {error}"]))
            self._drop(peer)

    def _drop(self, peer: int) -> None:
        sock = self._control.pop(peer, None)
        if sock is not None:
            sock.close()

    def _who(self, peer: int) -> str:
        return self._describe.get(peer, f"rank {peer}")


def _args(req: Request) -> dict[str, str]:
    return {"dtype": req.dtype, "shape": str(req.shape)}


def _group_missing(missing: dict[int, list[str]], names: set[str]) -> list[tuple[list[int], list[str]]]:
    """Missing ranks grouped by the (stalled) names they miss, for a compact fatal message."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for r, ns in sorted(missing.items()):
        key = tuple(n for n in ns if n in names)
        if key:
            groups.setdefault(key, []).append(r)
    return [(rs, list(ns)) for ns, rs in groups.items()]
