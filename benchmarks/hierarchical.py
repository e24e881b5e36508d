"""Flat vs hierarchical allreduce across hosts (the measurement behind HORA_HIERARCHICAL_ALLREDUCE's default).

Driver (default): runs the same allreduce sizes once with the flat TCP ring over every rank and once with the
hierarchical plane (shared memory within a host, one TCP ring per local rank across hosts), then prints a table::

    python benchmarks/hierarchical.py                               # fake hosts a:2,b:2 on this machine
    python benchmarks/hierarchical.py --hosts a:4,b:4 --sizes 16M,256M --iters 5
    python benchmarks/hierarchical.py --hosts a:3,b:1               # unequal slot counts
    python benchmarks/hierarchical.py --launcher "hora run -np 8 -H h1:4,h2:4"   # real (or namespace) hosts

With ``--hosts`` every rank runs on this machine and reports the fake host name it is given (``HORA_HOSTNAME``),
started with torchrun's variables: hora then uses one shared-memory segment per fake host and TCP (over
loopback) between them. That measures the algorithms and shared memory against loopback TCP, not a network: run
it across network namespaces or real hosts (``--launcher``: any command that starts the ranks, followed by
``python benchmarks/hierarchical.py --worker ...``) to measure a real link. The mode is passed to ``hvd.init()``
as an argument, so it holds whatever the launcher forwards.

Timing: each size is checked once for correctness (small whole numbers, exact in float32), then ``--warmup``
untimed iterations; every timed iteration starts after a barrier and is timed on every rank; the slowest rank's
time counts, and the median over iterations is reported. algbw = bytes / time; busbw = algbw * 2(N-1)/N
(nccl-tests' convention, N = ranks), GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, format_gbps, format_size, format_time, machine, parse_size, pattern, run_ranks

HERE = Path(__file__).resolve()
MODES = ("flat", "hierarchical")
DEFAULT_SIZES = "1M,4M,16M,64M,256M"


# -- worker ------------------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    import hora.numpy as hvd
    from hora._runtime.context import current

    hier = args.mode == "hierarchical"
    hvd.init(hierarchical_allreduce=hier, hierarchical_allgather=hier)
    rank, n = hvd.rank(), hvd.size()
    hosts = hvd.allgather_object(current().hostname)
    emit(rank, {"kind": "setup", "mode": args.mode, "size": n, "hosts": hosts,
                "transport": current().transport, "plane": type(current().engine._transport).__name__})  # fmt: skip
    for nbytes in args.sizes:
        count = max(1, nbytes // 4)
        buf = pattern(count, offset=float(rank))
        hvd.allreduce_(buf, op=hvd.Sum, name=f"bench.{nbytes}")
        expected = pattern(count) * n + np.float32(n * (n - 1) / 2)
        if not np.array_equal(buf, expected):
            raise SystemExit(f"rank {rank}: wrong allreduce result at {format_size(nbytes)} ({args.mode})")
        for _ in range(args.warmup):
            hvd.allreduce_(buf, op=hvd.Sum, name=f"bench.{nbytes}")
        iters = args.iters or max(3, min(50, int(2e9 // max(nbytes, 1) // 4)))
        times = np.empty(iters)
        for i in range(iters):
            hvd.barrier()
            t0 = time.perf_counter()
            hvd.allreduce_(buf, op=hvd.Sum, name=f"bench.{nbytes}")
            times[i] = time.perf_counter() - t0
        slowest = hvd.allreduce(times, op=hvd.Max, name=f"bench.max.{nbytes}")
        median = float(np.median(slowest))
        emit(rank, {"kind": "result", "mode": args.mode, "bytes": nbytes, "seconds": median, "iters": iters,
                    "algbw": nbytes / median / 1e9, "busbw": nbytes / median / 1e9 * 2 * (n - 1) / n})  # fmt: skip
    emit(rank, {"kind": "done", "mode": args.mode})
    hvd.shutdown()


# -- starting ranks on fake hosts ----------------------------------------------------------------------------------
def fake_hosts(spec: str) -> list[str]:
    """``"a:2,b:2"`` -> the fake host of each rank, ranks in host order."""
    hosts: list[str] = []
    for part in spec.split(","):
        name, _, count = part.partition(":")
        hosts += [name] * int(count or 1)
    return hosts


def spawn_fake_hosts(args: argparse.Namespace) -> int:
    """``--spawn``: start one rank per fake host slot with torchrun's variables, pass rank 0's stdout through, and
    end every rank when one fails or this process gets SIGTERM (the driver's time limit)."""
    hosts = fake_hosts(args.hosts)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runtime = tempfile.mkdtemp(prefix="hora-bench-")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("HORA_", "HOROVOD_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "MASTER_", "TORCHELASTIC_", "OMPI_", "PMIX_", "SLURM_"))}  # fmt: skip
    base.update(HORA_RUNTIME_DIR=runtime, TORCHELASTIC_RUN_ID=uuid.uuid4().hex, MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), WORLD_SIZE=str(len(hosts)), PYTHONUNBUFFERED="1")  # fmt: skip
    command = [sys.executable, str(HERE), "--worker", "--mode", args.mode, "--sizes", args.sizes_text,
               "--warmup", str(args.warmup), "--iters", str(args.iters)]  # fmt: skip
    procs = []
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.kill()

    signal.signal(signal.SIGTERM, stop)
    try:
        for r, host in enumerate(hosts):
            mates = [k for k, h in enumerate(hosts) if h == host]
            env = dict(base, RANK=str(r), LOCAL_RANK=str(mates.index(r)), LOCAL_WORLD_SIZE=str(len(mates)),
                       HORA_HOSTNAME=host)  # fmt: skip
            procs.append(subprocess.Popen(command, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in Path(runtime).glob("*"):
            f.unlink()
        os.rmdir(runtime)
    return 1 if stopping else max((abs(c) for c in codes), default=0)


# -- driver --------------------------------------------------------------------------------------------------------
def driver(args: argparse.Namespace) -> None:
    results: dict[tuple[str, int], dict[str, Any]] = {}
    setups: dict[str, dict[str, Any]] = {}
    worker_args = ["--sizes", args.sizes_text, "--warmup", str(args.warmup), "--iters", str(args.iters)]
    for mode in MODES:
        if args.launcher:
            cmd = [*shlex.split(args.launcher), sys.executable, str(HERE), "--worker", "--mode", mode, *worker_args]
        else:
            cmd = [sys.executable, str(HERE), "--spawn", "--hosts", args.hosts, "--mode", mode, *worker_args]
        print(f"running {mode}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        records, error = run_ranks(cmd, dict(os.environ), args.timeout)
        for rec in records:
            if rec["kind"] == "setup":
                setups[mode] = rec
            elif rec["kind"] == "result":
                results[(mode, rec["bytes"])] = rec
        if error:
            print(f"{mode}: {error}", file=sys.stderr)
    setup = setups.get("hierarchical") or setups.get("flat") or {}
    hosts = setup.get("hosts", [])
    layout = ", ".join(f"{h}: {hosts.count(h)}" for h in dict.fromkeys(hosts))
    print(f"\n### allreduce float32, {setup.get('size', '?')} ranks on hosts ({layout})\n")
    print(f"machine: {json.dumps(machine())}; planes: "
          + ", ".join(f"{m} = {s.get('plane')}" for m, s in setups.items()) + "\n")  # fmt: skip
    print("| size | flat time | flat busbw GB/s | hierarchical time | hierarchical busbw GB/s | hierarchical / flat |")
    print("|---:|---:|---:|---:|---:|---:|")
    for nbytes in args.sizes:
        flat, hier = results.get(("flat", nbytes)), results.get(("hierarchical", nbytes))

        def cell(rec: dict[str, Any] | None) -> str:
            return "—" if rec is None else f"{format_time(rec['seconds'])} | {format_gbps(rec['busbw'])}"

        ratio = f"{flat['seconds'] / hier['seconds']:.2f}x" if flat and hier else "—"
        print(f"| {format_size(nbytes)} | {cell(flat)} | {cell(hier)} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "setups": setups, "results": list(results.values())}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="a:2,b:2", help="fake hosts on this machine, name:ranks,... (default a:2,b:2)")
    p.add_argument("--launcher", default="", help="a command that starts the ranks on real hosts instead")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes (default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: adaptive, 3-50)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size (default 2)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per mode before the ranks are stopped")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spawn", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="hierarchical", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes_text = args.sizes
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.worker:
        worker(args)
    elif args.spawn:
        sys.exit(spawn_fake_hosts(args))
    else:
        driver(args)


if __name__ == "__main__":
    main()
