"""One shard on a server: its values, its optimizer slots, and the consistency rule its pulls wait under.

Every worker's pushes to a shard are counted (its *clock* on that shard). A pull by worker ``w`` waits until:

- ``async``: never;
- ``bounded`` (staleness ``k``): the slowest live worker's clock is at least ``clock[w] - k``, so no worker runs
  more than ``k`` steps ahead of the slowest (stale synchronous parallel);
- ``sync``: this worker's last step is applied. A step is applied once every worker pushed it: the server sums
  the N gradients in rank order (0, 1, ..., N-1), divides by N (except for the ``sum`` rule) and applies the rule
  once, so the result is bitwise what one process computing the same sum in the same order gets.

The staleness a pull observes is ``clock[w] - min(live clocks)``; the largest one seen is reported.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from hora.errors import CollectiveError, MismatchError, PeerLostError, TimeoutError
from hora.ps.rules import Deliver, Fetch, Sum, UpdateRule, apply_dense, apply_rows, apply_streamed, new_slots

__all__ = ["Shard"]


def _owned(grad: Any) -> Any:
    if isinstance(grad, tuple):
        return tuple(_owned(g) for g in grad)
    return grad if grad.flags.owndata else grad.copy()


class Shard:
    """A shard's state; every method takes the shard's lock."""

    def __init__(
        self,
        name: str,
        index: int,
        value: np.ndarray,
        rule: UpdateRule,
        mode: str,
        staleness: int,
        workers: int,
    ) -> None:
        self.name, self.index = name, index
        self.value = value
        self.rule = rule
        self.mode = mode
        self.staleness = staleness
        self.slots = new_slots(rule, value.shape, value.dtype)
        self.t = 0  # updates applied (Adam's step)
        self.clock = [0] * workers
        self.gone: set[int] = set()
        self.pending: dict[int, dict[int, Any]] = {}
        self.max_staleness = 0
        self.waiting: set[int] = set()  # workers whose pull waits right now
        self.poisoned = ""  # a registration mismatch: every later request on this shard raises it
        self.cond = threading.Condition()

    @property
    def row_bytes(self) -> int:
        return int(self.value[0].nbytes) if self.value.ndim else self.value.nbytes

    def describe(self) -> dict[str, Any]:
        return {
            "shape": list(self.value.shape),
            "dtype": self.value.dtype.str,
            "rule": self.rule.to_json(),
            "consistency": self.mode,
            "staleness": self.staleness,
        }

    def check_same(self, other: dict[str, Any], rank: int) -> None:
        mine = self.describe()
        if mine != other:
            diff = [
                f"{k}: {mine[k]!r} here, {other.get(k)!r} from worker {rank}"
                for k in mine
                if mine[k] != other.get(k)
            ]
            self.poisoned = (
                f"register '{self.name}' shard {self.index}: worker {rank} registered it differently from the first "
                f"worker ({'; '.join(diff)}); every worker must register the same variables with the same shape, "
                "dtype, rule and consistency"
            )
            raise MismatchError(self.poisoned)

    # -- updates --------------------------------------------------------------------------------------------------
    def push(self, rank: int, grad: Any) -> None:
        """``grad``: an array of the shard's shape, or ``(rows, grads)`` for a sparse push (unique rows)."""
        with self.cond:
            if self.mode == "sync":
                step = self.clock[rank]
                waiting = self.pending.setdefault(step, {})
                waiting[rank] = _owned(grad)  # kept past this request: not a view of the shared segment
                self.clock[rank] += 1
                if len(waiting) == len(self.clock):
                    self._apply_step(self.pending.pop(step))
                    self.cond.notify_all()
                return
            self.t += 1
            if isinstance(grad, tuple):
                apply_rows(self.rule, self.value, grad[0], grad[1], self.slots, self.t)
            else:
                apply_dense(self.rule, self.value, grad, self.slots, self.t)
            self._pushed(rank)

    def _pushed(self, rank: int) -> None:
        self.clock[rank] += 1
        if self.mode == "bounded":
            self.cond.notify_all()

    def exchange_remote(
        self, rank: int, fetch: Fetch | None, deliver: Deliver | None, timeout: float
    ) -> None:
        """A dense push (``fetch`` reads the gradient chunk by chunk from the worker), a pull (``deliver`` writes
        the values to the worker), or both, with no staging copy (:mod:`hora.ps.cma`). Under ``async`` a push_pull
        is one pass; ``sync`` reads the whole gradient first (it is kept until the step is complete)."""
        if fetch is not None:
            if self.mode == "sync":
                grad = np.empty(self.value.shape, self.value.dtype)
                fetch(0, grad.reshape(-1))
                self.push(rank, grad)
            else:
                with self.cond:
                    self.t += 1
                    now = deliver if self.mode == "async" else None
                    apply_streamed(self.rule, self.value, self.slots, self.t, fetch, now)
                    self._pushed(rank)
                    if now is not None:
                        self._observe(rank)
                        return
        if deliver is not None:
            self.wait_readable(rank, timeout)
            with self.cond:
                deliver(0, np.ascontiguousarray(self.value).reshape(-1))

    def push_pull(self, rank: int, grad: np.ndarray, out: np.ndarray, timeout: float) -> None:
        """A dense push and then a read into ``out`` (which may be ``grad``'s memory). Under ``async`` one pass:
        each chunk is updated and copied out while it is in the cache."""
        if self.mode != "async":
            self.push(rank, grad)
            self.read(rank, timeout, out=out)
            return
        with self.cond:
            self.t += 1
            apply_dense(self.rule, self.value, grad, self.slots, self.t, out=out)
            self._pushed(rank)
            self._observe(rank)

    def _apply_step(self, grads: dict[int, Any]) -> None:
        n = len(grads)
        self.t += 1
        if all(not isinstance(g, tuple) for g in grads.values()):
            acc = grads[0].copy()
            for r in range(1, n):
                acc += grads[r]
            if not isinstance(self.rule, Sum):
                np.divide(acc, n, out=acc)
            apply_dense(self.rule, self.value, acc, self.slots, self.t)
            return
        rows_list, grad_list = [], []
        for r in range(n):
            g = grads[r]
            if isinstance(g, tuple):
                rows_list.append(g[0])
                grad_list.append(g[1])
            else:
                rows_list.append(np.arange(len(self.value), dtype=np.int64))
                grad_list.append(g)
        rows, inverse = np.unique(np.concatenate(rows_list), return_inverse=True)
        summed = np.zeros((len(rows), *self.value.shape[1:]), self.value.dtype)
        np.add.at(summed, inverse, np.concatenate(grad_list))
        if not isinstance(self.rule, Sum):
            np.divide(summed, n, out=summed)
        apply_rows(self.rule, self.value, rows, summed, self.slots, self.t)

    # -- reads ----------------------------------------------------------------------------------------------------
    def wait_readable(self, rank: int, timeout: float) -> None:
        """Block until worker ``rank`` may read this shard under its consistency rule (see the module docstring)."""
        if self.mode == "async":
            with self.cond:
                self._observe(rank)
            return
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self._readable(rank):
                missing = self._behind(rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(self._waiting_for(rank, missing, timeout))
                if missing and all(w in self.gone for w in missing):
                    raise PeerLostError(
                        f"pull '{self.name}' shard {self.index}: worker {rank} waits for worker(s) "
                        f"{sorted(missing)}, which disconnected; in '{self.mode}' mode every worker must push "
                        "the same number of steps (use async mode to let workers leave early)"
                    )
                self.waiting.add(rank)  # reported by stats(): who the consistency rule holds back now
                try:
                    self.cond.wait(min(left, 0.5))
                finally:
                    self.waiting.discard(rank)
            self._observe(rank)

    def _readable(self, rank: int) -> bool:
        if self.mode == "sync":
            return all(step >= self.clock[rank] for step in self.pending)  # its steps are all applied
        live = [c for w, c in enumerate(self.clock) if w not in self.gone] or [self.clock[rank]]
        return min(live) >= self.clock[rank] - self.staleness

    def _behind(self, rank: int) -> list[int]:
        need = self.clock[rank] if self.mode == "sync" else self.clock[rank] - self.staleness
        return [
            w for w, c in enumerate(self.clock) if c < need and (self.mode == "sync" or w not in self.gone)
        ]

    def _waiting_for(self, rank: int, missing: list[int], timeout: float) -> str:
        what = (
            f"step {self.clock[rank] - 1} to be pushed by every worker"
            if self.mode == "sync"
            else f"the slowest worker to come within {self.staleness} steps of its step {self.clock[rank]}"
        )
        return (
            f"pull '{self.name}' shard {self.index}: worker {rank} waited {timeout:g}s for {what}; still behind: "
            f"worker(s) {missing} (clocks {[self.clock[w] for w in missing]}). A worker stopped or is far slower; "
            "raise HORA_OP_TIMEOUT_SECONDS, or use a larger staleness / async mode"
        )

    def _observe(self, rank: int) -> None:
        if not self.gone:
            self.max_staleness = max(self.max_staleness, self.clock[rank] - min(self.clock))
            return
        live = [c for w, c in enumerate(self.clock) if w not in self.gone] or [self.clock[rank]]
        self.max_staleness = max(self.max_staleness, self.clock[rank] - min(live))

    def read(self, rank: int, timeout: float, out: np.ndarray | None = None) -> np.ndarray:
        """A consistent copy of the values (the caller sends it without holding the lock), into ``out`` if given."""
        self.wait_readable(rank, timeout)
        with self.cond:
            if out is None:
                return self.value.copy()
            np.copyto(out, self.value)
            return out

    def read_rows(
        self, rank: int, rows: np.ndarray, timeout: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        self.wait_readable(rank, timeout)
        with self.cond:
            return np.take(self.value, rows, axis=0, out=out, mode="clip")  # rows were checked by the caller

    def rejoin(self, rank: int) -> None:
        with self.cond:
            self.gone.discard(rank)

    def leave(self, rank: int) -> None:
        with self.cond:
            self.gone.add(rank)
            self.cond.notify_all()

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        with self.cond:
            out = {"value": self.value.copy(), "t": np.array(self.t, np.int64)}
            out.update({f"slot_{k}": v.copy() for k, v in self.slots.items()})
            return out

    def assign(self, value: np.ndarray, slots: dict[str, np.ndarray], t: int) -> None:
        with self.cond:
            if value.shape != self.value.shape:
                raise CollectiveError(
                    f"restore '{self.name}' shard {self.index}: shape {value.shape} != {self.value.shape}"
                )
            self.value[...] = value
            for k, v in slots.items():
                if k in self.slots:
                    self.slots[k][...] = v
            self.t = t
