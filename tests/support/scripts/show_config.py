"""Prints the engine settings this rank resolves, as one JSON line: ``CONFIG {...}``. Needs no collective.

Arguments ``name=value`` are passed to ``Config.resolve(overrides=...)``, as ``hvd.init(name=value)`` would be.
"""

import json
import sys

from hora.config import Config

ENGINE = (
    "fusion_threshold",
    "cycle_time_ms",
    "cache_capacity",
    "stall_check_disable",
    "stall_check_time",
    "stall_shutdown_time",
    "timeline",
    "timeline_mark_cycles",
)

overrides = dict(arg.split("=", 1) for arg in sys.argv[1:])
cfg = Config.resolve(overrides=overrides)
print("CONFIG " + json.dumps({name: getattr(cfg, name) for name in ENGINE}, sort_keys=True), flush=True)
