"""How long the engine waits between cycles (:class:`Pacing`).

With work in flight on some rank the next cycle comes after HORA_CYCLE_TIME; with none anywhere the idle pause
doubles up to :data:`IDLE_MAX`. Once this rank has had collectives in flight for :data:`LONG_WAIT` without one
completing — a peer is late: evaluating, checkpointing alone, or stalled — cycles come every :data:`STALLED_PAUSE`
and their waits block instead of spinning, so a waiting rank sleeps (a collective that becomes ready then waits at
most that pause more).
"""

from __future__ import annotations

import time
from typing import Any

from hora._engine.handle import Handle

__all__ = ["IDLE_MAX", "LONG_WAIT", "STALLED_PAUSE", "Pacing"]

IDLE_MAX = 0.02  # the longest pause between cycles when no rank has anything in flight
LONG_WAIT = 1.0
STALLED_PAUSE = 0.02


class Pacing:
    """The engine's pauses between cycles; ``settings.cycle_time`` may change (autotune)."""

    def __init__(self, settings: Any) -> None:
        self._s = settings
        self.idle = settings.cycle_time  # the pause when nothing is in flight here
        self._progress_at = time.monotonic()  # the last cycle that completed a collective or had none in flight

    def after_cycle(self, now: float, busy_anywhere: bool, progressed: bool, in_flight: bool) -> None:
        self.idle = self._s.cycle_time if busy_anywhere else min(max(self.idle, 1e-3) * 2, IDLE_MAX)
        if progressed or not in_flight:
            self._progress_at = now

    def stalled_pause(self) -> float:
        """0, or :data:`STALLED_PAUSE` once collectives have been in flight here for :data:`LONG_WAIT` without one
        completing."""
        return STALLED_PAUSE if time.monotonic() - self._progress_at > LONG_WAIT else 0.0

    def rest(self, handle: Handle, left: float | None) -> bool:
        """For a thread about to drive a cycle for ``handle``: whether the wait is long. It then first sleeps a
        pause (less when the handle completes, or ``left`` ends sooner), and the cycle's waits should block."""
        pause = self.stalled_pause()
        if pause:
            handle.settle(pause if left is None else min(pause, left))
        return bool(pause)
