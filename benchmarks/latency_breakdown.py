"""Where the time of one small allreduce goes: latency.py's loop with hora's steps timed one by one.

Run under a launcher (this script is one rank):

    hora run -np 2 python benchmarks/latency_breakdown.py [--size 4K] [--iters 5000] [--barrier]

Before ``init()`` it wraps the steps of a call in timers (each wrapper costs about 0.2 µs, counted in its step):
the frontend's request (``start_allreduce``: checks, the request, the entry, the engine's queue), the wait that
drives the engine's cycles, each cycle and, inside it, the classification, the direct path's packing and reduction,
the shared-memory barrier and, inside that, the spinning (``_wait_for``) and the futex sleeps (``_sleep_for``). Rank
0 prints per call: the median of the whole call, and for each step the mean time and the calls per allreduce (2
cycles per allreduce would mean a second round). What no step covers is the rest of the Python in between.
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from typing import Any

import numpy as np
from _common import format_size, parse_size

import hora.numpy as hvd
from hora._engine import engine as engine_mod
from hora._engine import exchange as exchange_mod
from hora._engine import express as express_mod
from hora._frontend import reductions
from hora._transport import shm

TOTALS: collections.Counter[str] = collections.Counter()
COUNTS: collections.Counter[str] = collections.Counter()
ON = [False]


def _timed(label: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ON[0]:
            return fn(*args, **kwargs)
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter_ns() - t0
            COUNTS[label] += 1

    return wrapper


STEPS = [
    (express_mod.ExpressLane, "run", "express lane (a cached call run by the caller)"),
    (express_mod.ExpressLane, "_cycle", "  express cycle"),
    (reductions, "start_allreduce", "frontend: start_allreduce (checks, request, entry, enqueue)"),
    (engine_mod.Engine, "enqueue", "  engine.enqueue"),
    (engine_mod.Engine, "_drive_until", "wait: driving the cycles"),
    (engine_mod.Engine, "_cycle", "  cycle"),
    (engine_mod.Engine, "_classify", "    classify (response cache)"),
    (exchange_mod.DirectPath, "pack", "    direct path: pack into the exchange row"),
    (shm.ShmTransport, "_barrier", "    shm barrier (exchange)"),
    (shm.ShmTransport, "_wait_for", "      spin and wait for the peer"),
    (shm.ShmTransport, "_sleep_for", "        futex sleep"),
    (exchange_mod.DirectPath, "run", "    direct path: reduce the rows"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4K", help="message size in bytes (K/M binary)")
    parser.add_argument("--iters", type=int, default=5000, help="timed calls")
    parser.add_argument("--barrier", action="store_true", help="barrier before every timed call")
    parser.add_argument("--all-ranks", action="store_true", help="every rank prints its breakdown (default: rank 0)")
    args = parser.parse_args()
    for owner, attr, label in STEPS:
        setattr(owner, attr, _timed(label, getattr(owner, attr)))
    hvd.init()
    size = parse_size(args.size)
    buf = np.zeros(max(size // 4, 1), np.float32)
    name = f"breakdown.{size}"
    for _ in range(50):
        hvd.allreduce_(buf, op=hvd.Sum, name=name)
    times = np.empty(args.iters)
    for i in range(args.iters):
        if args.barrier:
            hvd.barrier()
        ON[0] = True
        t0 = time.perf_counter()
        hvd.allreduce_(buf, op=hvd.Sum, name=name)
        times[i] = time.perf_counter() - t0
        ON[0] = False
    if hvd.rank() == 0 or args.all_ranks:
        n = args.iters
        print(f"N={hvd.size()} allreduce {format_size(size)}: median {np.median(times) * 1e6:.1f} µs, "
              f"mean {times.mean() * 1e6:.1f} µs per call (timers included)")
        for _, _, label in STEPS:
            if COUNTS[label]:
                print(f"{label:<62} {TOTALS[label] / n / 1e3:7.1f} µs  x{COUNTS[label] / n:.2f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
