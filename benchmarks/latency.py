"""Latency of one named in-place allreduce, back to back: the number a training loop of small tensors sees.

Run under a launcher (this script is one rank):

    hora run -np 2 python benchmarks/latency.py                  # 4 KiB, 2000 calls
    hora run -np 2 python benchmarks/latency.py --sizes 4K,64K --barrier
    hora run -np 2 python benchmarks/latency.py --sizes 16M,100M --op average --iters 40 --barrier

Every rank times ``allreduce_(buf, op=Sum, name=...)`` calls (the same name each time, so after the first call
the response cache answers it, as for a training loop's gradients); rank 0 prints the median, 10th and 90th
percentile of its own call times. ``--barrier`` puts a barrier before every call (what collectives.py does),
which adds how far apart the ranks leave the barrier. ``--op average`` times ``op=Average`` instead (the sum then
scaled by 1/N, what gradient averaging runs).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import format_size, parse_size

import hora.numpy as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4K", help="message sizes in bytes, comma-separated (K/M binary)")
    parser.add_argument("--iters", type=int, default=2000, help="timed calls per size")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls per size first")
    parser.add_argument("--barrier", action="store_true", help="barrier before every timed call")
    parser.add_argument("--op", choices=("sum", "average"), default="sum", help="the reduction (default: sum)")
    args = parser.parse_args()

    hvd.init()
    op = hvd.Sum if args.op == "sum" else hvd.Average
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        buf = np.zeros(max(size // 4, 1), np.float32)  # zeros: in-place sums stay finite
        name = f"latency.{size}"
        for _ in range(args.warmup):
            hvd.allreduce_(buf, op=op, name=name)
        times = np.empty(args.iters)
        for i in range(args.iters):
            if args.barrier:
                hvd.barrier()
            t0 = time.perf_counter()
            hvd.allreduce_(buf, op=op, name=name)
            times[i] = time.perf_counter() - t0
        if hvd.rank() == 0:
            p10, p50, p90 = np.percentile(times, [10, 50, 90]) * 1e6
            barrier = ", barrier before each" if args.barrier else ""
            print(
                f"N={hvd.size()} allreduce {format_size(size)} {args.op}{barrier}: median {p50:.1f} µs "
                f"(p10 {p10:.1f}, p90 {p90:.1f}) over {args.iters} calls",
                flush=True,
            )
    hvd.shutdown()


if __name__ == "__main__":
    main()
