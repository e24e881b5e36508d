"""The stall inspector (rank 0): collectives some ranks submitted and others did not.

What waits in the coordinator longer than HORA_STALL_CHECK_TIME_SECONDS is logged, one line per missing rank, and
again every check period while it waits; past HORA_STALL_SHUTDOWN_TIME_SECONDS the inspector returns a verdict that
rank 0 sends to every rank in the next full round, and every rank raises StallError.
"""

from __future__ import annotations

import logging

from hora._engine.negotiation import Coordinator, format_ranks

__all__ = ["StallInspector"]

log = logging.getLogger("hora")


class StallInspector:
    """Checks the coordinator's waiting collectives every tenth of the check (or shutdown) time."""

    def __init__(self, size: int, check_time: float, shutdown_time: float, describe: dict[int, str]) -> None:
        self._size = size
        self._describe = describe  # rank -> "rank 3 (host b, pid 4242)"
        self._check = check_time
        self._stop = shutdown_time
        self._next = 0.0
        self._warned: dict[str, float] = {}

    def inspect(self, now: float, coordinator: Coordinator) -> str | None:
        """Warn about stalled collectives; return the fatal verdict once one has waited past the shutdown time."""
        if now < self._next:
            return None
        check, stop = self._check, self._stop
        self._next = now + min(check, stop or check) / 10
        joined = set(coordinator.joined)
        stalled = {n: (t, rs) for n, (t, rs) in coordinator.pending().items() if t > check}
        self._warned = {n: t for n, t in self._warned.items() if n in stalled}
        if not stalled:
            return None
        missing: dict[int, list[str]] = {}
        for name, (_, ranks) in sorted(stalled.items()):
            for r in range(self._size):
                if r not in ranks and r not in joined:
                    missing.setdefault(r, []).append(name)
        due = [n for n in stalled if now - self._warned.get(n, -1e18) >= check]
        if due:
            for n in due:
                self._warned[n] = now
            lines = "\n".join(
                f"{r}: [{', '.join(names)}]" + (f"  ({self._describe[r]})" if r in self._describe else "")
                for r, names in sorted(missing.items())
            )
            log.warning(
                "Stalled collectives: %d waited more than %gs for other ranks. This may indicate that different "
                "ranks are trying to submit different tensors or that only a subset of ranks is submitting "
                "tensors, which will cause deadlock.\nMissing ranks:\n%s\n%s",
                len(stalled),
                check,
                lines,
                self._what_next(stalled),
            )
        if stop > 0:
            over = sorted(n for n, (t, _) in stalled.items() if t > stop)
            if over:
                who = "; ".join(
                    f"{format_ranks(rs)} never submitted {', '.join(repr(n) for n in ns)}"
                    for rs, ns in _group_missing(missing, set(over))
                )
                return (
                    f"stalled: {len(over)} collective(s) waited more than {stop:g}s "
                    f"(HORA_STALL_SHUTDOWN_TIME_SECONDS): {who}. Every rank must submit the same collectives; "
                    "check for a rank that skips a step or names a tensor differently."
                )
        return None

    def _what_next(self, stalled: dict[str, tuple[float, list[int]]]) -> str:
        """What happens to the waiting ranks, and the setting that decides it."""
        setting = "--stall-check-shutdown-time-seconds (HORA_STALL_SHUTDOWN_TIME_SECONDS)"
        if self._stop <= 0:
            return f"Nothing ends this wait: {setting} is 0 (never); set it to shut the job down instead."
        longest = max(t for t, _ in stalled.values())
        return (
            f"The job is shut down with a StallError if they still wait {max(0.0, self._stop - longest):.0f}s "
            f"from now ({self._stop:g}s in all, {setting}; 0 never)."
        )


def _group_missing(missing: dict[int, list[str]], names: set[str]) -> list[tuple[list[int], list[str]]]:
    """Missing ranks grouped by the (stalled) names they miss, for a compact fatal message."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for r, ns in sorted(missing.items()):
        key = tuple(n for n in ns if n in names)
        if key:
            groups.setdefault(key, []).append(r)
    return [(rs, list(ns)) for ns, rs in groups.items()]
