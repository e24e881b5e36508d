"""The express lane: a blocking small allreduce the response cache knows, run by the calling thread as one cycle.

A training loop's small collectives recur under the same names, and most calls find the engine idle. For such a
call (a cached allreduce small enough for the direct path, nothing else in flight on this rank, no timeline) the
calling thread takes the engine's drive lock and runs the cycle itself, without a request, an entry or a handle:
it writes exactly the exchange row a full cycle would write for that one collective (its ready bit marked 2, its
data after the vector, the same flags), passes the exchange's barrier, and, when every rank's row says the same
(every rank marked that slot with its data and nothing else: no full round, join, invalidation or goodbye), reduces
the rows' data into the output. Every other outcome turns the call into an ordinary entry, as if it had been
submitted before this cycle, and the cycle goes on as the engine's own (``Engine._after_exchange``); the caller
then waits for its handle. A peer running a full cycle meanwhile sees an ordinary row, so the ranks need not agree
on who takes the lane.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hora._dtypes import DTYPE_NAMES, scale_into, ufunc
from hora._engine.handle import Entry
from hora._engine.messages import Kind, Request

if TYPE_CHECKING:
    from hora._engine.engine import Engine

__all__ = ["ExpressLane"]


@dataclass
class _Plan:
    """What the lane derived for one call signature from the cache (valid while ``cached`` is what the cache
    holds under the name): the slot, the reduction, and the payload views of each exchange buffer."""

    cached: object
    slot: int
    mark: int  # 2: the data travels in the row (an allreduce); 1: ready, nothing to carry (a barrier)
    flags: bytes
    fn: np.ufunc | None
    n: int
    dtype: np.dtype | None
    post: float
    parts: dict[int, list[np.ndarray]]


class ExpressLane:
    """One engine's express lane (``engine._direct_path`` must exist: shared memory with a response cache).

    A call costs a few µs of Python besides the barrier, so the lane keeps, for each of the two alternating
    exchange buffers, memoryviews of the rows (a byte written or compared through one costs a fraction of what a
    numpy operation on a tiny array does), and for each call signature a :class:`_Plan`."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        layout = engine._layout
        self._flags_at, self._end = layout.FULL, layout.length
        # the flags of a cycle with one ready cached collective and nothing else: BUSY, and for one that carries
        # its data (marked 2) MARKS 1, MARKS_NEG -1
        flags = np.zeros(self._end - self._flags_at, np.int8)
        flags[layout.BUSY - layout.FULL] = -1
        self._ready_flags = flags.view(np.uint8).tobytes()
        flags[layout.MARKS - layout.FULL], flags[layout.MARKS_NEG - layout.FULL] = 1, -1
        self._flag_bytes = flags.view(np.uint8).tobytes()
        self._zeros = bytes(self._flags_at)
        self._payload_at = layout.payload_at
        self._capacity = layout.capacity
        self._rows: dict[int, tuple[np.ndarray, memoryview, list[memoryview]]] = {}  # parity -> rows, views
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self.calls = 0  # collectives the lane completed (for tests and diagnostics)
        self.handed_over = 0  # calls whose cycle needed more than the lane (they became entries)

    def run(
        self, name: str, arr: np.ndarray | None, out: np.ndarray | None, op: int, pre: float, post: float
    ) -> Entry | bool:
        """Reduce ``arr`` into ``out`` in this thread (``arr`` None: a barrier): True when done; an
        :class:`Entry` to wait for when the cycle needed more than the lane; False when the lane does not apply
        (submit as usual)."""
        e = self._e
        if not e._cache_on or e._timeline is not None:
            return False
        plan = self._plan(name, arr, op, pre, post)
        if plan is None or not e._drive.acquire(blocking=False):
            return False
        try:
            with e._lock:
                if e._queue or e._pending or e._failed is not None or e._stopping or not e._cycling:
                    return False
            if e._cached_ready or e._uncached or e._invalid or e._joined or e._stall_fatal is not None:
                return False
            if e.autotune.wants_round():
                return False
            return self._cycle(plan, arr, out, name)
        finally:
            e._drive.release()

    def _plan(self, name: str, arr: np.ndarray | None, op: int, pre: float, post: float) -> _Plan | None:
        cache, path = self._e._cache, self._e._direct_path
        assert cache is not None and path is not None
        key = (name, None, (), op, pre, post) if arr is None else (name, arr.dtype, arr.shape, op, pre, post)
        plan = self._plans.get(key)
        cached = cache.entry(name)
        if plan is not None and plan.cached is cached:
            return plan
        if len(self._plans) > 4 * self._capacity:
            self._plans.clear()
        # the request the frontend would submit, as the cache compares it (built only when no plan stands)
        if arr is None:
            slot, hit = cache.lookup(Request(Kind.BARRIER, name))
            if not hit:
                return None
            plan = self._plans[key] = _Plan(cached, slot, 1, self._ready_flags, None, 0, None, 1.0, {})
            return plan
        req = Request(Kind.ALLREDUCE, name, DTYPE_NAMES.get(arr.dtype, ""), arr.shape, op, prescale=pre, postscale=post)
        slot, hit = cache.lookup(req)
        info = path.info(slot) if hit else None
        if info is None:
            return None
        dtype, n, reduce_op, post_scale = info
        plan = self._plans[key] = _Plan(cached, slot, 2, self._flag_bytes, ufunc(reduce_op), n, dtype, post_scale, {})
        return plan

    def _views(self, parity: int, rows: np.ndarray) -> tuple[np.ndarray, memoryview, list[memoryview]]:
        views = self._rows.get(parity)
        if views is None or views[0] is not rows:
            mvs = [memoryview(rows[r]).cast("B") for r in range(rows.shape[0])]
            views = self._rows[parity] = (rows, mvs[self._e.rank], mvs)
        return views

    def _cycle(self, plan: _Plan, arr: np.ndarray | None, out: np.ndarray | None, name: str) -> Entry | bool:
        e = self._e
        transport = e._transport
        nxt = transport.exchange_next()
        if nxt is None:  # not shared memory: the exchange carries no data
            return False
        parity, rows = nxt
        _, mine, every = self._views(parity, rows)
        F, end, at, slot, n, mark = self._flags_at, self._end, self._payload_at, plan.slot, plan.n, plan.mark
        mine[:F] = self._zeros
        mine[slot] = mark
        mine[F:end] = plan.flags
        if arr is not None:
            try:
                mine[at : at + n] = memoryview(arr).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer
            except (TypeError, ValueError):  # a dtype without a buffer format (bfloat16): through numpy
                rows[e.rank, at : at + n] = arr.reshape(-1).view(np.int8)
        now = time.monotonic()
        e._cycles += 1
        transport.eager = True
        transport.what = "a small allreduce in hora's negotiation exchange"
        outcome: list[Entry | bool] = [False]

        def cycle() -> bool:
            transport.exchange_end()
            flags = plan.flags
            for mv in every:
                if mv[slot] != mark or mv[F:end] != flags:
                    return self._more(plan, arr, out, name, rows, now, outcome)
            if plan.fn is not None:
                assert out is not None
                parts = plan.parts.get(parity)
                if parts is None:
                    assert plan.dtype is not None
                    parts = plan.parts[parity] = [rows[r, at : at + n].view(plan.dtype) for r in range(len(every))]
                flat = out.reshape(-1)
                plan.fn(parts[0], parts[1], out=flat)  # rank order on every rank: bitwise identical results
                for p in parts[2:]:
                    plan.fn(flat, p, out=flat)
                if plan.post != 1.0:
                    scale_into(flat, plan.post, flat)
            e._agreed_marks = (1, 1)
            e._cache.touch(slot)  # type: ignore[union-attr]
            e.autotune.record([e._cache.response(slot)])  # type: ignore[union-attr]
            e._end_cycle(now, True, True, True)
            e._express_at = now
            self.calls += 1
            outcome[0] = True
            return True

        e._guarded(cycle)
        if outcome[0] is True:
            return True
        if isinstance(outcome[0], Entry):
            return outcome[0]
        with e._lock:
            failed = e._failed
        if failed is not None:  # the exchange itself failed: the engine failed everything, this call too
            raise type(failed)(str(failed))
        return False

    def _more(
        self,
        plan: _Plan,
        arr: np.ndarray | None,
        out: np.ndarray | None,
        name: str,
        rows: np.ndarray,
        now: float,
        outcome: list[Entry | bool],
    ) -> bool:
        """The cycle needs more than the lane: the call becomes an entry submitted before this cycle (its row
        already says so), and the cycle goes on as the engine's own."""
        e = self._e
        self.handed_over += 1
        entry = Entry(e._cache.mine(plan.slot), arr, out)  # type: ignore[union-attr]
        entry.queued_at = now
        entry.handle._driver = e._drive_until
        with e._lock:
            e._pending[name] = entry
        e._cached_ready[plan.slot] = entry
        e._marked = {plan.slot: self._payload_at} if plan.mark == 2 else {}
        np.minimum.reduce(rows[:, : e._vec.size], axis=0, out=e._vec)
        outcome[0] = entry
        return e._after_exchange(e._vec, rows, now, False, True, None)
