"""The background engine: one per process (and per process set), negotiating and executing every collective in
lockstep cycles.

User threads call :meth:`Engine.enqueue`; the engine runs *cycles*, and every rank runs the same sequence of them.
A cycle:

1. **classifies** what was enqueued since the last one: a request equal to one answered before is in the
   **response cache** (``cache.py``) under the same slot on every rank and only sets that slot's *ready* bit;
   anything else waits for a full round;
2. runs the **exchange** (``exchange.py``): one small ``MIN`` collective of a flag vector over the transport, so
   that ready bits AND and flags OR across ranks; tiny cached allreduces ride inside it on shared memory;
3. runs the cached collectives ready on every rank, in slot order: no message goes through rank 0;
4. runs a **full round** when some rank needs one (a new name, a changed shape, a join, a stall verdict): every
   worker sends its new requests to the coordinator on rank 0 over its control connection (``control.py``), and
   rank 0's :class:`~hora._engine.negotiation.Coordinator` answers every rank with the same list of responses;
5. **executes** the cycle's responses, grouped by **fusion** (``fusion.py``), so every rank calls the transport in
   the same order;
6. switches to the **autotune** point this cycle's full round carried, on every rank at once (``autotune.py``);
7. on rank 0, runs the **stall inspector** (``stall.py``).

A transport failure (a peer died, a timeout) is fatal for the job: the engine fails every pending handle, makes
its peers fail fast (shm abort word / closed sockets) and refuses later collectives. A rank that shuts down sets
its BYE bit; every rank then fails what is pending with ShutdownError and stops cycling.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from hora._engine.autotune import TuneLink
from hora._engine.cache import ResponseCache, cacheable
from hora._engine.control import ControlLinks, leaving_message
from hora._engine.exchange import DIRECT_MAX_TENSORS, DirectPath, ExchangeLayout
from hora._engine.execute import run_responses, transport_activity
from hora._engine.express import ExpressLane
from hora._engine.full_round import negotiate
from hora._engine.handle import Entry, Handle, duplicate_name
from hora._engine.messages import Kind, Response
from hora._engine.negotiation import Coordinator
from hora._engine.pacing import IDLE_MAX, Pacing
from hora._engine.settings import EngineSettings
from hora._engine.stall import StallInspector
from hora._engine.timeline import Timeline
from hora._engine.wakeup import WakePipe
from hora._transport.base import Transport
from hora.errors import HoraError, HoraInternalError, MismatchError, PeerLostError, ShutdownError, StallError

__all__ = ["Engine", "EngineSettings"]

log = logging.getLogger("hora")



class Engine:
    """Owns the engine thread, the control connections and the transport of one process (or process set)."""

    def __init__(
        self,
        rank: int,
        size: int,
        transport: Transport,
        control: dict[int, socket.socket],
        settings: EngineSettings,
        describe_rank: dict[int, str] | None = None,
    ) -> None:
        self.rank, self.size = rank, size
        self._transport = transport
        # rank 0: every worker's socket; workers: {0: the coordinator's socket}
        self._control = ControlLinks(rank, control, settings.op_timeout, settings.max_frame_bytes, describe_rank or {})
        self._s = settings
        self._coordinator = Coordinator(size) if rank == 0 else None
        self._stalls = (
            StallInspector(size, settings.stall_check_time, settings.stall_shutdown_time, describe_rank or {})
            if rank == 0 and settings.stall_check
            else None
        )
        self._lock = threading.Lock()
        self._queue: deque[Entry] = deque()
        self._pending: dict[str, Entry] = {}
        self._failed: HoraError | None = None
        self._stopping = False
        self._bye = -1  # what this rank's BYE flag says: -1 shutdown(), -2 the process is exiting, -3 after an error
        self._wakeup = WakePipe()
        # cycle state (engine thread only)
        cap = settings.cache_capacity
        self._cache = ResponseCache(cap) if cap > 0 else None
        self._cached_ready: dict[int, Entry] = {}  # slot -> entry waiting for the AND
        self._uncached: list[Entry] = []  # to send to the coordinator in the next full round
        self._invalid: set[int] = set()
        self._joined = False
        self._stall_fatal: str | None = None
        self._layout = ExchangeLayout(cap, size)
        self._vec = np.zeros(self._layout.length, np.int8)
        self._direct_path = DirectPath(self._cache, self._layout, size) if self._cache is not None else None
        self._marked: dict[int, int] = {}  # slot -> offset of this rank's direct-path data in this cycle
        # min and max over ranks of how many slots they marked: equal to this rank's count means same layout
        self._agreed_marks = (0, 0)
        self._pacing = Pacing(settings)
        self._timeline: Timeline | None = None
        if rank == 0 and settings.timeline:
            self._timeline = Timeline(settings.timeline, settings.timeline_mark_cycles)
        self._drive = threading.Lock()  # held by whichever thread runs a cycle
        self._cycling = True
        self._user_drivers = 0
        self._thread = threading.Thread(target=self._run, name=f"hora-engine-{rank}", daemon=True)
        self.autotune = TuneLink(rank, settings, transport)  # rank 0 tunes; every rank switches with it
        self._cache_on, self._cycles = True, 0  # autotune may switch the cache off (and on) on every rank at once
        rows = self._direct_path is not None and transport.exchange_next() is not None  # shared memory
        self._express = ExpressLane(self) if rows else None
        self._express_at = -1.0  # when the express lane last ran a collective

    # -- user-thread API ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def express(self, name: str, arr: Any, out: Any, op: int = 1, pre: float = 1.0, post: float = 1.0) -> Entry | bool:
        """A blocking allreduce (``arr`` None: a barrier) the response cache knows, run in the calling thread
        (:mod:`.express`): True when done, an entry to wait for, or False (submit it as usual)."""
        return self._express.run(name, arr, out, op, pre, post) if self._express is not None else False

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
            dup = duplicate_name(entries, pending)
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

    def shutdown(self, timeout: float = 10.0, exiting: str = "") -> None:
        """Stop the engine; every other rank fails what is pending with ShutdownError. ``exiting``: "" for a call
        of shutdown(), "exit" when the process is exiting, "error" when it exits after an uncaught exception (the
        other ranks' messages say which)."""
        with self._lock:
            self._bye = {"": -1, "exit": -2, "error": -3}[exiting]
            self._stopping = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("hora engine thread did not stop within %gs", timeout)
            return
        self.stop_timeline()
        self.autotune.close()
        self._transport.close()
        self._control.close()
        self._wakeup.close()

    def _wake(self) -> None:
        self._wakeup.wake()

    # -- engine thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._pause()
            with self._drive:
                if not self._cycling:
                    return
                with self._lock:
                    deferring = self._deferring()
                if not deferring:
                    self._guarded_cycle(eager=False)

    def _guarded_cycle(self, eager: bool) -> None:
        """Run one cycle (in the engine thread or in a user thread waiting for its handle); on failure, fail
        every handle and stop cycling. ``eager``: the waits may spin (the thread has nothing else to do)."""
        self._transport.eager = eager
        self._guarded(self._cycle)

    def _guarded(self, cycle: Callable[[], bool]) -> None:
        """Run ``cycle`` (a whole cycle, or the express lane's); on failure, fail every handle and stop cycling."""
        try:
            if not cycle():
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
                stalled = self._pacing.rest(handle, left)  # a long wait sleeps between cycles (their waits block)
                if not self._drive.acquire(timeout=-1 if left is None else left):
                    return
                try:
                    if handle.done() or not self._cycling:
                        return
                    self._guarded_cycle(eager=not stalled)
                finally:
                    self._drive.release()
        finally:
            with self._lock:
                self._user_drivers -= 1
                more = bool(self._pending)
            if more:
                self._wake()  # the engine thread takes over what is still in flight

    def _deferring(self) -> bool:
        """Whether a user thread runs the cycles (under ``_lock``): one waits for its handle, or the express lane
        ran one less than IDLE_MAX ago and nothing is pending (an idle cycle here would only steal the GIL)."""
        return self._user_drivers > 0 or (not self._pending and time.monotonic() - self._express_at < IDLE_MAX)

    def _pause(self) -> None:
        """Wait for local work, at most the idle period (:mod:`.pacing`). Work in flight goes straight to the next
        exchange, which waits for the peers itself, unless it has waited long. While a user thread drives, sleep
        until it leaves (it wakes this thread if work remains): waking up only to find the cycle taken would steal
        the GIL from the spinning driver. Woken by new asynchronous work, wait HORA_CYCLE_TIME before the cycle
        (Horovod's cycle time), so that a burst of submissions (a backward pass) is negotiated and fused together
        rather than one by one. A thread that waits for its handle does not pay this: it drives the cycle itself."""
        with self._lock:
            driven = self._deferring()
            stopping = self._stopping
            busy = (bool(self._pending) and not driven) or stopping
        if not busy:
            woken = self._wakeup.wait(IDLE_MAX if driven else self._pacing.idle)
            if woken and not driven and self._s.cycle_time > 0:
                time.sleep(self._s.cycle_time)
        elif not stopping and (pause := self._pacing.stalled_pause()):
            self._wakeup.wait(pause)  # in flight for long: a late peer, no need to spin for it
        self._wakeup.drain()  # before the cycle: a later enqueue wakes again, an earlier one is served

    def _cycle(self) -> bool:
        """One cycle; False once this engine stops cycling (a rank shut down)."""
        with self._lock:
            new, self._queue = self._queue, deque()
            stopping = self._stopping
            busy = bool(self._pending)
            timeline = self._timeline
        now = time.monotonic()
        self._cycles += 1
        for e in new:
            self._classify(e)
        cap = self._s.cache_capacity
        row = self._transport.exchange_begin()
        vec = self._vec if row is None else row[: self._vec.size]  # shared memory: filled in place
        F = self._layout.FULL
        vec[:F] = 0
        flags = [0] * (vec.size - F)  # FULL JOINED BUSY ANY_INVALID MARKS MARKS_NEG BYE...
        if self._cached_ready:
            if self._s.stall_check:
                half = self._s.stall_check_time / 2
                self._invalid.update(s for s, e in self._cached_ready.items() if now - e.queued_at > half)
            vec[list(self._cached_ready)] = 1
            if row is not None and len(self._cached_ready) <= DIRECT_MAX_TENSORS:
                assert self._direct_path is not None  # cached requests exist only with a cache
                self._marked = self._direct_path.pack(row, self._cached_ready)
                count = min(len(self._marked), 127)
                flags[self._layout.MARKS - F], flags[self._layout.MARKS_NEG - F] = count, -count
        if self._invalid:
            vec[[cap + s for s in self._invalid]] = -1
            flags[self._layout.ANY_INVALID - F] = -1
            self._invalid.clear()
        if self._uncached or self._stall_fatal is not None or self.autotune.wants_round():
            flags[0] = -1
        if self._joined:
            flags[self._layout.JOINED - F] = -1
        if busy:
            flags[self._layout.BUSY - F] = -1
        if stopping:
            flags[self._layout.BYE + self.rank - F] = self._bye
        vec[F:] = flags
        self._transport.what = "hora's negotiation exchange"
        rows = None
        if row is None:
            self._transport.exchange_min(vec)
        else:
            rows = self._transport.exchange_end()
            np.minimum.reduce(rows[:, : self._vec.size], axis=0, out=self._vec)
            vec = self._vec
        return self._after_exchange(vec, rows, now, stopping, busy, timeline)

    def _after_exchange(
        self,
        vec: np.ndarray,
        rows: np.ndarray | None,
        now: float,
        stopping: bool,
        busy: bool,
        timeline: Timeline | None,
    ) -> bool:
        """The rest of a cycle once the exchange gave ``vec`` (its minimum over ranks) and, on shared memory, every
        rank's ``rows``; False once this engine stops cycling."""
        F = self._layout.FULL
        cap = self._s.cache_capacity
        flags = vec[F:].tolist()
        full, joined, busy_anywhere, any_invalid = flags[0], flags[1], flags[2], flags[3]
        self._agreed_marks = (flags[4], -flags[5])

        if any(flags[self._layout.BYE - F :]):
            byes = {r: code for r in range(self.size) if (code := flags[self._layout.BYE - F + r])}
            self._on_bye(byes, stopping)
            return False
        if timeline is not None and busy_anywhere:
            timeline.mark_cycle()

        ready: list[tuple[Response, Entry | None]] = []
        direct_ran = False
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
                    direct_ran = True
        elif cap and any_invalid:
            assert self._cache is not None
            for slot in np.flatnonzero(vec[cap : 2 * cap]).tolist():
                self._cache.evict(slot)
        if full:
            ready.extend(self._full_round(timeline))
        if ready:
            self._execute_all(ready, timeline)
        self._end_cycle(now, bool(busy_anywhere), bool(ready) or direct_ran, busy)
        return True

    def _end_cycle(self, now: float, busy_anywhere: bool, progressed: bool, busy: bool) -> None:
        """What closes every cycle, on every rank alike: pacing, the autotune switch, the stall inspector."""
        self._pacing.after_cycle(now, busy_anywhere, progressed, busy)
        # a point carried by this cycle's full round reached every rank: all switch here, between the same cycles
        point = self.autotune.after_cycle(self._cycles, self._s, self._transport)
        if point is not None and self._cache is not None and point.cache_enabled != self._cache_on:
            self._cache_on = point.cache_enabled
            self._cache.clear()  # every rank forgets every slot: requests waiting on one renegotiate
            for slot in list(self._cached_ready):
                self._demote(slot)
        if self._stalls is not None and self._stall_fatal is None:
            assert self._coordinator is not None
            self._stall_fatal = self._stalls.inspect(now, self._coordinator)

    def _classify(self, entry: Entry) -> None:
        req = entry.request
        if req.kind is Kind.JOIN:
            self._joined = True
        elif self._cache is not None and self._cache_on:
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
        now = time.monotonic()
        # how long each request has waited on this rank already (a cached one first waits in the cache), so the
        # stall inspector counts from the first submission, as its documented time promises
        waited = [max(0.0, now - e.queued_at) for e in self._uncached]
        self._uncached = []
        fatal, self._stall_fatal = self._stall_fatal, None
        responses, fatal = negotiate(
            self._control, self._coordinator, requests, waited, fatal, self.autotune, timeline
        )
        if fatal is not None:
            raise StallError(str(fatal))
        out: list[tuple[Response, Entry | None]] = []
        for resp in responses:
            with self._lock:
                entry = self._pending.get(resp.request.name)
            out.append((resp, entry))
            if self._cache is not None and self._cache_on and entry is not None and cacheable(resp):
                evicted = self._cache.put(resp, entry.request)
                if evicted is not None:
                    self._demote(evicted)
            if resp.request.kind is Kind.JOIN and resp.error is None:
                self._joined = False
        return out

    # -- execution -------------------------------------------------------------------------------------------
    def _execute_all(self, ready: list[tuple[Response, Entry | None]], timeline: Timeline | None) -> None:
        def started(names: list[str]) -> None:
            with self._lock:
                for n in names:
                    self._pending.pop(n, None)

        run_responses(self._transport, self.rank, ready, self._s.fusion_threshold, timeline, started)
        self.autotune.record(r for r, _ in ready)

    def _run_direct(self, direct: list[tuple[int, Entry]], rows: np.ndarray, timeline: Timeline | None) -> None:
        assert self._direct_path is not None
        self._transport.what = "a small allreduce in hora's negotiation exchange"
        with self._lock:
            for _, entry in direct:
                self._pending.pop(entry.request.name, None)
        activity = transport_activity(self._transport, Kind.ALLREDUCE)
        self._direct_path.run(direct, rows, self._marked, self._agreed_marks, timeline, activity)
        assert self._cache is not None
        self.autotune.record(self._cache.response(slot) for slot, _ in direct)

    # -- failure and shutdown ---------------------------------------------------------------------------------------
    def _on_bye(self, byes: dict[int, int], me_too: bool) -> None:
        """Ranks ``byes`` (rank -> its BYE code) are leaving: fail what is pending, saying why."""
        others = {r: code for r, code in byes.items() if r != self.rank}
        error = ShutdownError(leaving_message(others, self._control.who) or f"hora was shut down on rank {self.rank}")
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
        self._transport.abort(str(error))
        if self._coordinator is not None:
            self._control.abort_all(f"rank 0 (the coordinator) failed: {error}")
        else:
            self._control.close()

