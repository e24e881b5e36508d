"""The settings the engine reads, taken from a :class:`hora.config.Config`; autotune changes some of them while
the engine runs (every rank at the same cycle)."""

from __future__ import annotations

from typing import Any

__all__ = ["EngineSettings"]


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
        # 0 is never; a shutdown time below the check time can only be the default (a given one is refused):
        # it follows the check time
        shutdown = config.stall_shutdown_time
        self.stall_shutdown_time: float = max(shutdown, config.stall_check_time) if shutdown > 0 else 0.0
        self.timeline: str = config.timeline
        self.timeline_mark_cycles: bool = config.timeline_mark_cycles
        # autotune (the global engine only: process sets keep their settings)
        self.autotune: bool = config.autotune
        self.autotune_log: str = config.autotune_log_file
        self.autotune_warmup_samples: int = config.autotune_warmup_samples
        self.autotune_steps_per_sample: int = config.autotune_steps_per_sample
        self.autotune_max_samples: int = config.autotune_bayes_opt_max_samples
        self.autotune_noise: float = config.autotune_gaussian_process_noise
