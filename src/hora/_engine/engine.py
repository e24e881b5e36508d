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
from hora._engine.fusion import nbytes, plan
from hora._engine.handle import Entry, Handle
from hora._engine.messages import Kind, ReduceOp, Request, Response, decode, encode
from hora._engine.negotiation import Coordinator, format_ranks
from hora._engine.timeline import Timeline
from hora._runtime.auth import recv_frame, send_frame
from hora._transport.base import DTYPES, HALF, DataPlane, combine, reduce_into
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

__all__ = ["Engine", "EngineSettings", "exchange_length", "exchange_row_bytes"]

log = logging.getLogger("hora")

_ERRORS: dict[str, type[CollectiveError]] = {
    "mismatch": MismatchError,
    "duplicate": MismatchError,
    "shutdown": ShutdownError,
    "join": CollectiveError,
    "stall": StallError,
}

_IDLE_MAX = 0.02  # the longest pause between cycles when no rank has anything in flight


#: Cached allreduces up to this size travel inside the exchange (shared memory only), up to DIRECT_PAYLOAD_BYTES
#: per rank and cycle: one barrier per small collective instead of the exchange's plus two more.
DIRECT_MAX_BYTES = 64 << 10
DIRECT_PAYLOAD_BYTES = 256 << 10
#: ... and only in cycles with at most this many ready cached collectives: the direct path costs a few µs of
#: Python per tensor, more than a fused reduction's per-tensor cost once there are many.
DIRECT_MAX_TENSORS = 4


def exchange_length(cache_capacity: int, size: int) -> int:
    """Bytes of the exchange vector: ready and invalid bits per cache slot, three flags, a BYE flag per rank."""
    return 2 * cache_capacity + 6 + size


def exchange_row_bytes(cache_capacity: int, size: int) -> int:
    """Bytes of a rank's exchange row in shared memory: the vector, then room for direct-path payloads."""
    vector = -(-exchange_length(cache_capacity, size) // 64) * 64
    return vector + (DIRECT_PAYLOAD_BYTES if cache_capacity else 0)


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
        self._wake_pending = False
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
        self._FULL, self._JOINED, self._BUSY, self._ANY_INVALID = 2 * c, 2 * c + 1, 2 * c + 2, 2 * c + 3
        self._MARKS, self._MARKS_NEG, self._BYE = 2 * c + 4, 2 * c + 5, 2 * c + 6
        self._vec = np.zeros(exchange_length(c, size), np.int8)
        self._payload_at = -(-self._vec.size // 64) * 64  # where direct-path data starts in an exchange row
        self._marked: dict[int, int] = {}  # slot -> offset of this rank's direct-path data in this cycle
        # min and max over ranks of how many slots they marked: equal to this rank's count means same layout
        self._agreed_marks = (0, 0)
        self._direct: dict[int, tuple[Response, Any]] = {}  # id(cached response) -> its direct-path facts
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

    def enqueue(self, entries: Iterable[Entry], wake: bool = True) -> None:
        """Submit entries atomically (a group either all goes in or none does). ``wake=False`` when the caller
        waits for them at once: its wait runs the cycles, and the engine thread sleeps on."""
        entries = list(entries)
        pending = self._pending
        with self._lock:
            if self._failed is not None:
                raise type(self._failed)(str(self._failed))
            if self._stopping:
                raise ShutdownError("hora is shutting down on this rank; no new collective can start")
            if len(entries) == 1:  # the common case (a gradient's hook): no lists, no set
                dup = entries[0].request.name if entries[0].request.name in pending else None
            else:
                names = [e.request.name for e in entries]
                taken = [n for n in names if n in pending]
                dup = None
                if taken or len(set(names)) < len(names):
                    dup = taken[0] if taken else next(n for n in names if names.count(n) > 1)
            if dup is not None:
                raise MismatchError(
                    f"a collective named '{dup}' is already in flight on rank {self.rank}; names must be unique "
                    "among pending collectives (synchronize the first one, or pick another name)"
                )
            now = time.monotonic()
            driver = self._drive_until
            for e in entries:
                e.queued_at = now
                e.handle._driver = driver
                pending[e.request.name] = e
            self._queue.extend(entries)
        if wake:
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
        if self._wake_pending:  # already woken and not yet up: one write is enough (each costs a context switch)
            return
        self._wake_pending = True
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
                    self._guarded_cycle(eager=False)

    def _guarded_cycle(self, eager: bool) -> None:
        """Run one cycle (in the engine thread or in a user thread waiting for its handle); on failure, fail
        every handle and stop cycling. ``eager``: the waits may spin (the thread has nothing else to do)."""
        self._plane.eager = eager
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
                    self._guarded_cycle(eager=True)
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
        waits for the peers itself. While a user thread drives, sleep until it leaves (it wakes this thread if
        work remains): waking up only to find the cycle taken would steal the GIL from the spinning driver.

        Woken by new asynchronous work, wait HORA_CYCLE_TIME before the cycle (Horovod's cycle time), so that a
        burst of submissions (a backward pass) is negotiated and fused together rather than one by one. A thread
        that waits for its handle does not pay this: it drives the cycle itself at once."""
        with self._lock:
            driven = self._user_drivers > 0
            busy = (bool(self._pending) and not driven) or self._stopping
        if not busy:
            woken = select.select([self._wake_r], [], [], _IDLE_MAX if driven else self._idle)[0]
            if woken and not driven and self._s.cycle_time > 0:
                time.sleep(self._s.cycle_time)
        self._wake_pending = False  # before draining: a later enqueue writes again, an earlier one is queued
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
        cap = self._s.cache_capacity
        row = self._plane.exchange_begin()
        vec = self._vec if row is None else row[: self._vec.size]  # shared memory: filled in place
        F = self._FULL
        vec[:F] = 0
        flags = [0] * (vec.size - F)  # FULL JOINED BUSY ANY_INVALID MARKS MARKS_NEG BYE...
        if self._cached_ready:
            if self._s.stall_check:
                half = self._s.stall_check_time / 2
                self._invalid.update(s for s, e in self._cached_ready.items() if now - e.queued_at > half)
            vec[list(self._cached_ready)] = 1
            if row is not None and len(self._cached_ready) <= DIRECT_MAX_TENSORS:
                self._marked = self._pack_direct(row)
                count = min(len(self._marked), 127)
                flags[self._MARKS - F], flags[self._MARKS_NEG - F] = count, -count
        if self._invalid:
            vec[[cap + s for s in self._invalid]] = -1
            flags[self._ANY_INVALID - F] = -1
            self._invalid.clear()
        if self._uncached or self._stall_fatal is not None:
            flags[0] = -1
        if self._joined:
            flags[self._JOINED - F] = -1
        if busy:
            flags[self._BUSY - F] = -1
        if stopping:
            flags[self._BYE + self.rank - F] = -1
        vec[F:] = flags
        self._plane.what = "hora's negotiation exchange"
        rows = None
        if row is None:
            self._plane.exchange_min(vec)
        else:
            rows = self._plane.exchange_end()
            np.minimum.reduce(rows[:, : self._vec.size], axis=0, out=self._vec)
            vec = self._vec
        flags = vec[F:].tolist()
        full, joined, busy_anywhere, any_invalid = flags[0], flags[1], flags[2], flags[3]
        self._agreed_marks = (flags[4], -flags[5])

        if any(flags[self._BYE - F :]):
            self._on_bye([r for r in range(self.size) if flags[self._BYE - F + r]], stopping)
            return False
        self._idle = self._s.cycle_time if busy_anywhere else min(max(self._idle, 1e-3) * 2, _IDLE_MAX)
        if timeline is not None and busy_anywhere:
            timeline.mark_cycle()

        ready: list[tuple[Response, Entry | None]] = []
        if cap and self._cached_ready:
            assert self._cache is not None
            if any_invalid:
                for slot in np.flatnonzero(vec[cap : 2 * cap]).tolist():
                    self._cache.evict(slot)
                    self._demote(slot)
            if joined:  # while a rank is joined, everything goes through the coordinator
                for slot in list(self._cached_ready):
                    self._demote(slot)
            else:
                direct = []
                for slot in sorted(self._cached_ready):  # what is ready everywhere is ready here: few to look at
                    agreed = vec[slot]
                    if agreed <= 0:
                        continue
                    entry = self._cached_ready.pop(slot)
                    self._cache.touch(slot)
                    if agreed == 2:  # every rank put its data in its exchange row
                        direct.append((slot, entry))
                    else:
                        ready.append((self._cache.response(slot), entry))
                if direct:
                    assert rows is not None
                    self._run_direct(direct, rows, timeline)
        elif cap and any_invalid:
            assert self._cache is not None
            for slot in np.flatnonzero(vec[cap : 2 * cap]).tolist():
                self._cache.evict(slot)
        if full:
            ready.extend(self._full_round(timeline))
        if ready:
            self._execute_all(ready, timeline)
        if self.rank == 0 and self._s.stall_check:
            self._inspect_stalls(now)
        return True

    # -- direct path: tiny cached allreduces ride in the exchange itself ------------------------------------------
    def _pack_direct(self, row: np.ndarray) -> dict[int, int]:
        """Put the data of this rank's ready tiny cached allreduces after the vector in its exchange row, in slot
        order, and mark them 2 instead of 1: where every rank marked 2, the exchange has carried every rank's
        data and each rank reduces it from the rows, with no further barrier. Returns slot -> offset."""
        assert self._cache is not None
        pos, limit = self._payload_at, row.size
        marked: dict[int, int] = {}
        for slot in sorted(self._cached_ready):
            info = self._direct_info(slot)
            if info is None:
                continue
            n = info[1]
            if pos + n > limit:
                break
            src = self._cached_ready[slot].input
            assert src is not None
            row[pos : pos + n] = src.reshape(-1).view(np.int8)
            row[slot] = 2
            marked[slot] = pos
            pos += -(-n // 8) * 8
        return marked

    def _direct_info(self, slot: int) -> tuple[np.dtype, int, int, float] | None:
        """(dtype, bytes, op, postscale) of a cached allreduce small enough for the direct path, else None."""
        assert self._cache is not None
        resp = self._cache.response(slot)
        info = self._direct.get(id(resp))
        if info is None or info[0] is not resp:
            req = resp.request
            ok = (
                req.kind is Kind.ALLREDUCE
                and req.prescale == 1.0
                and nbytes(resp) <= DIRECT_MAX_BYTES
                and not (DTYPES[req.dtype] in HALF and self.size > 2)  # would need float32 accumulation
            )
            op, post = req.op, req.postscale
            if op == ReduceOp.AVERAGE:
                op, post = ReduceOp.SUM, post / self.size
            info = (resp, (DTYPES[req.dtype], nbytes(resp), op, post) if ok else None)
            if len(self._direct) > 4 * max(self._s.cache_capacity, 1):
                self._direct.clear()
            self._direct[id(resp)] = info
        return info[1]

    def _run_direct(self, direct: list[tuple[int, Entry]], rows: np.ndarray, timeline: Timeline | None) -> None:
        assert self._cache is not None
        mine = self._marked
        low, high = self._agreed_marks
        if low == high == len(mine) < 127:
            offsets = [mine] * self.size  # every rank marked the same slots, so placed them where this rank did
        else:
            offsets = []
            for r in range(self.size):  # where rank r put each slot: its own marked slots, in slot order
                at, pos = {}, self._payload_at
                for slot in np.flatnonzero(rows[r, : self._s.cache_capacity] == 2).tolist():
                    at[slot] = pos
                    pos += -(-nbytes(self._cache.response(slot)) // 8) * 8
                offsets.append(at)
        self._plane.what = "a small allreduce in hora's negotiation exchange"
        with self._lock:
            for _, entry in direct:
                self._pending.pop(entry.request.name, None)
        for slot, entry in direct:
            info = self._direct_info(slot)
            assert info is not None and entry.input is not None
            dtype, n, op, post = info
            out = entry.output if entry.output is not None else np.empty_like(entry.input)
            flat = out.reshape(-1)
            parts = [rows[r, offsets[r][slot] : offsets[r][slot] + n].view(dtype) for r in range(self.size)]
            if timeline is not None:
                timeline.start(entry.request.name, "allreduce", _args(entry.request))
                timeline.activity_start(entry.request.name, self._transport_activity(Kind.ALLREDUCE))
            if self.size == 1:
                flat[...] = parts[0]
            else:
                combine(parts[0], parts[1], flat, op)  # rank order on every rank: bitwise identical results
                for p in parts[2:]:
                    reduce_into(flat, p, op)
            if post != 1.0:
                np.multiply(flat, post, out=flat, casting="unsafe")
            if timeline is not None:
                timeline.end(entry.request.name)
            entry.handle._set_result(out)

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
                if r.kind is not Kind.JOIN:  # opens the phase unless open (the timeline may start mid-negotiation)
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
                f"{self._who(peer)} closed its control connection during negotiation: the process died or left "
                f"without hvd.shutdown() ({exc})"
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
