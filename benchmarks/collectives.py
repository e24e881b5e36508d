"""Collective benchmark: hora against torch.distributed (gloo) and Open MPI (mpi4py), interleaved in one run.

Driver (default): for each N it starts the workers of every framework one after another, so all numbers come
from the same machine state, then prints one Markdown table per (op, N)::

    python benchmarks/collectives.py                        # full default run
    python benchmarks/collectives.py --sizes 4K,1M --np 2 --iters 5 --json /tmp/bench.json

Worker (``--worker hora|gloo|mpi``): runs inside every rank; rank 0 prints one ``HORA_BENCH {json}`` line per
measurement on stdout. hora and gloo workers are started with ``hora run`` (which also exports RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT for ``init_process_group("gloo")``), MPI workers with ``mpirun``.

Timing: the correctness of each (op, size) is checked once with a known pattern, then ``--warmup`` untimed
iterations run; every timed iteration starts after a barrier and is timed on each rank; the per-iteration maximum
across ranks is taken and the median over iterations reported. Without ``--iters`` the iteration count adapts:
enough iterations for about ``--min-time`` seconds, at least ``--min-iters``, at most ``--max-iters``.

With ``--load K``, every framework at every N is measured twice in a row, quiet and then with K foreign busy
processes (``python -c "while True: pass"``) on the machine, and the tables show both: users' machines are busy.

Sizes are float32 messages; K/M/G are binary (1K = 1024 bytes). For allgather the size is the *total output*
(each rank contributes size/N), as in nccl-tests. GB/s means 1e9 bytes per second. Bus bandwidth follows
nccl-tests: allreduce busbw = algbw*2(N-1)/N, allgather busbw = algbw*(N-1)/N, broadcast busbw = algbw.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from typing import Any

import numpy as np
from _common import (
    busy_processes,
    emit,
    finish,
    format_gbps,
    format_size,
    format_time,
    hora_command,
    machine,
    mpi_env,
    mpirun_command,
    parse_counts,
    parse_size,
    pattern,
    run_ranks,
    torch_missing,
)

OPS = ("allreduce", "allgather", "broadcast")
FRAMEWORKS = ("hora", "hora-tcp", "gloo", "mpi")
LABELS = {"hora": "hora", "hora-tcp": "hora (tcp)", "gloo": "gloo", "mpi": "Open MPI"}
DEFAULT_SIZES = "4K,64K,1M,16M,64M,256M"


# -- sizes and bandwidth -------------------------------------------------------------------------------------------
def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: what each link must carry relative to the message size."""
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    return 1.0


def message_count(op: str, nbytes: int, n: int) -> int:
    """float32 elements per rank's *input* buffer (allgather: each rank contributes 1/N of the output)."""
    count = max(1, nbytes // 4)
    return max(1, count // n) if op == "allgather" else count


# -- workers -------------------------------------------------------------------------------------------------------
class Backend:
    """One framework's collectives on float32 numpy buffers (what the timing loop calls)."""

    name = ""
    rank = 0
    size = 1

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def allgather(self, inp: np.ndarray, out: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def broadcast(self, buf: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def max_all(self, values: np.ndarray) -> np.ndarray:
        """Element-wise maximum of a small float64 array across ranks (not timed)."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class HoraBackend(Backend):
    name = "hora"

    def __init__(self) -> None:
        import hora
        import hora.numpy as hvd

        self.hvd = hvd
        self.version = hora.__version__
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.tag = ""  # a fixed name per (op, size), as a training loop would reuse its tensor names

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        return self.hvd.allreduce_(buf, op=self.hvd.Sum, name=f"allreduce.{self.tag}")

    def allgather(self, inp: np.ndarray, out: np.ndarray) -> np.ndarray:
        # hora has no in-place allgather: the result is a new array, as for a Horovod user.
        return self.hvd.allgather(inp, name=f"allgather.{self.tag}")

    def broadcast(self, buf: np.ndarray) -> np.ndarray:
        return self.hvd.broadcast_(buf, root_rank=0, name=f"broadcast.{self.tag}")

    def barrier(self) -> None:
        self.hvd.barrier()

    def max_all(self, values: np.ndarray) -> np.ndarray:
        return self.hvd.allreduce(values, op=self.hvd.Max, name=f"bench.max.{self.tag}")

    def info(self) -> dict[str, Any]:
        return {"version": self.version, "transport": os.environ.get("HORA_TRANSPORT", "auto")}

    def close(self) -> None:
        self.hvd.shutdown()


class GlooBackend(Backend):
    name = "gloo"

    def __init__(self) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        # all_gather_single is the newer name of all_gather_into_tensor (which warns in recent torch).
        self._gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._tensors: dict[int, Any] = {}

    def _t(self, arr: np.ndarray) -> Any:
        # torch.from_numpy shares memory; cache so the timed loop does not build a tensor object per call.
        key = arr.__array_interface__["data"][0]
        t = self._tensors.get(key)
        if t is None or t.numel() != arr.size:
            t = self._tensors[key] = self.torch.from_numpy(arr)
        return t

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(self._t(buf), op=self.dist.ReduceOp.SUM)
        return buf

    def allgather(self, inp: np.ndarray, out: np.ndarray) -> np.ndarray:
        self._gather(self._t(out), self._t(inp))
        return out

    def broadcast(self, buf: np.ndarray) -> np.ndarray:
        self.dist.broadcast(self._t(buf), src=0)
        return buf

    def barrier(self) -> None:
        self.dist.barrier()

    def max_all(self, values: np.ndarray) -> np.ndarray:
        t = self.torch.from_numpy(values.copy())
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.numpy()

    def info(self) -> dict[str, Any]:
        return {"version": f"torch {self.torch.__version__}"}

    def close(self) -> None:
        self._tensors.clear()
        self.dist.destroy_process_group()


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def allgather(self, inp: np.ndarray, out: np.ndarray) -> np.ndarray:
        self.comm.Allgather(inp, out)
        return out

    def broadcast(self, buf: np.ndarray) -> np.ndarray:
        self.comm.Bcast(buf, root=0)
        return buf

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_all(self, values: np.ndarray) -> np.ndarray:
        out = values.copy()
        self.comm.Allreduce(self.MPI.IN_PLACE, out, op=self.MPI.MAX)
        return out

    def info(self) -> dict[str, Any]:
        import mpi4py

        library = self.MPI.Get_library_version().replace("\0", "").split(",")[0].strip()  # "Open MPI v4.1.4"
        return {"version": f"{library}; mpi4py {mpi4py.__version__}"}


def check(op: str, backend: Backend, count: int) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """Run ``op`` once on a known pattern and verify the result; returns the buffers to time with and ok."""
    n, r = backend.size, backend.rank
    if op == "allreduce":
        buf = pattern(count, scale=r + 1)
        result = backend.allreduce(buf)
        ok = bool(np.array_equal(result, pattern(count, scale=n * (n + 1) / 2)))
        buf.fill(0.0)  # timed in place: zeros keep the values from growing to inf over many iterations
        return buf, None, ok
    if op == "allgather":
        inp = pattern(count, offset=1000.0 * r)
        out = np.empty(count * n, np.float32)
        result = backend.allgather(inp, out)
        ok = result.shape == (count * n,) and all(
            np.array_equal(result[i * count : (i + 1) * count], pattern(count, offset=1000.0 * i))
            for i in range(n)
        )
        return inp, out, ok
    buf = pattern(count, offset=7.0) if r == 0 else np.zeros(count, np.float32)
    result = backend.broadcast(buf)
    ok = bool(np.array_equal(result, pattern(count, offset=7.0)))
    return buf, None, ok


def measure(backend: Backend, op: str, nbytes: int, args: argparse.Namespace) -> dict[str, Any]:
    count = message_count(op, nbytes, backend.size)
    if isinstance(backend, HoraBackend):
        backend.tag = format_size(nbytes)
    buf, out, ok = check(op, backend, count)
    ok = bool(backend.max_all(np.array([0.0 if ok else 1.0]))[0] == 0.0)
    call = {
        "allreduce": lambda: backend.allreduce(buf),
        "allgather": lambda: backend.allgather(buf, out),  # type: ignore[arg-type]
        "broadcast": lambda: backend.broadcast(buf),
    }[op]

    clock = time.perf_counter
    warm = np.zeros(max(1, args.warmup))
    for i in range(max(1, args.warmup)):
        backend.barrier()
        t0 = clock()
        call()
        warm[i] = clock() - t0
    if args.iters:
        iters = args.iters
    else:
        # Every rank derives the count from the same (max-reduced) estimate, so they all run the same loop.
        estimate = float(backend.max_all(np.array([float(np.median(warm))]))[0])
        iters = int(min(args.max_iters, max(args.min_iters, math.ceil(args.min_time / max(estimate, 1e-9)))))
    times = np.zeros(iters)
    for i in range(iters):
        backend.barrier()
        t0 = clock()
        call()
        times[i] = clock() - t0
    times = backend.max_all(times)  # per iteration, the slowest rank
    median = float(np.median(times))
    n = backend.size
    algbw = nbytes / median / 1e9
    return {
        "kind": "result",
        "framework": args.label,
        "op": op,
        "size": nbytes,
        "np": n,
        "count_per_rank": count,
        "iters": iters,
        "warmup": max(1, args.warmup),
        "ok": ok,
        "time_median_s": median,
        "time_min_s": float(times.min()),
        "time_max_s": float(times.max()),
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(op, n),
    }


def worker(args: argparse.Namespace) -> int:
    backend: Backend = {"hora": HoraBackend, "gloo": GlooBackend, "mpi": MpiBackend}[args.worker]()
    emit(backend.rank, {"kind": "start", "framework": args.label, "np": backend.size, **backend.info()})
    for op in args.ops:
        for nbytes in args.sizes:
            emit(backend.rank, measure(backend, op, nbytes, args))
    backend.barrier()
    emit(backend.rank, {"kind": "done", "framework": args.label})
    backend.close()
    return 0


# -- driver --------------------------------------------------------------------------------------------------------
def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """GB/s of a plain numpy copy of ``nbytes`` (best of ``repeats``; memory traffic is twice this: read + write)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def worker_argv(args: argparse.Namespace, kind: str, label: str) -> list[str]:
    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        kind,
        "--label",
        label,
        "--ops",
        ",".join(args.ops),
        "--sizes",
        ",".join(str(s) for s in args.sizes),
        "--warmup",
        str(args.warmup),
        "--min-time",
        str(args.min_time),
        "--min-iters",
        str(args.min_iters),
        "--max-iters",
        str(args.max_iters),
    ]
    if args.iters:
        argv += ["--iters", str(args.iters)]
    return argv


def launch_command(
    args: argparse.Namespace, framework: str, n: int
) -> tuple[list[str], dict[str, str]] | str:
    """The command line and environment that start ``framework``'s workers, or why it is skipped."""
    env = dict(os.environ)
    if framework in ("hora", "hora-tcp", "gloo"):
        transport = {"hora": "shm", "hora-tcp": "tcp"}.get(framework)
        if transport:
            env["HORA_TRANSPORT"] = transport
        if framework == "gloo" and (missing := torch_missing()):
            return missing
        kind = "gloo" if framework == "gloo" else "hora"
        return hora_command(n, transport) + worker_argv(args, kind, framework), env
    cmd = mpirun_command(n, args.mpirun_args)
    if isinstance(cmd, str):
        return cmd
    return cmd + worker_argv(args, "mpi", framework), mpi_env(env)


def run_framework(
    args: argparse.Namespace, framework: str, n: int
) -> tuple[list[dict[str, Any]], str | None]:
    """Start one framework's workers at N ranks; return rank 0's records and an error note (None when fine)."""
    launch = launch_command(args, framework, n)
    if isinstance(launch, str):
        return [], launch

    def progress(rec: dict[str, Any]) -> None:
        if rec["kind"] == "result":
            flag = "" if rec["ok"] else "  WRONG RESULT"
            print(
                f"  {LABELS[framework]:>10} N={n} {rec['op']:<9} {format_size(rec['size']):>5}: "
                f"{format_time(rec['time_median_s']):>10}  busbw {rec['busbw_GBps']:7.3f} GB/s  "
                f"({rec['iters']} iters){flag}",
                file=sys.stderr,
                flush=True,
            )

    return run_ranks(*launch, timeout=args.timeout, on_record=progress)


def cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "—"
    if not rec["ok"]:
        return "WRONG RESULT"
    return f"{format_gbps(rec['busbw_GBps'])} GB/s ({format_time(rec['time_median_s'])})"


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None or b is None or not (a["ok"] and b["ok"]):
        return "—"
    return f"{b['time_median_s'] / a['time_median_s']:.2g}x"


def tables(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for load in _loads(args):
        lines.append(f"## {'quiet' if not load else f'with {load} busy foreign process(es)'}\n")
        lines.append(_tables_at(args, [r for r in results if r.get("load", 0) == load]))
    return "\n".join(lines)


def _loads(args: argparse.Namespace) -> list[int]:
    return [0, args.load] if args.load else [0]


def _tables_at(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    index = {(r["framework"], r["op"], r["size"], r["np"]): r for r in results}
    shown = list(args.frameworks)
    lines: list[str] = []
    for op in args.ops:
        for n in args.np:
            header = ["size", *(LABELS[f] for f in shown)]
            pairs = [
                (f"hora/{'MPI' if other == 'mpi' else other}", other)
                for other in ("gloo", "mpi")
                if "hora" in shown and other in shown
            ]
            header += [p[0] for p in pairs]
            lines += [
                f"### {op}, N = {n}  (busbw, median time per op)",
                "",
                "| " + " | ".join(header) + " |",
                "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
            ]
            for size in args.sizes:
                row = [format_size(size)] + [cell(index.get((f, op, size, n))) for f in shown]
                row += [
                    ratio(index.get(("hora", op, size, n)), index.get((other, op, size, n)))
                    for _, other in pairs
                ]
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    started = time.time()
    copy_gbps = copy_bandwidth()
    print(
        f"# Collective benchmark: {', '.join(args.ops)}; sizes {', '.join(map(format_size, args.sizes))}; "
        f"N = {', '.join(map(str, args.np))}\n",
        flush=True,
    )
    print(
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}. numpy copy of 256 MiB: {copy_gbps:.1f} GB/s "
        f"(memory traffic {2 * copy_gbps:.1f} GB/s).\n",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    notes: list[str] = []
    for n in args.np:
        for framework in args.frameworks:  # interleaved: every framework at this N before the next N
            print(
                f"[{time.time() - started:6.0f}s] {LABELS[framework]} at N={n}", file=sys.stderr, flush=True
            )
            for load in _loads(args):  # quiet, then loaded, back to back: the same machine state otherwise
                with busy_processes(load):
                    records, note = run_framework(args, framework, n)
                for rec in records:
                    if rec["kind"] == "start":
                        versions[framework] = rec.get("version", "")
                    elif rec["kind"] == "result":
                        results.append({**rec, "load": load})
                if note:
                    notes.append(f"{LABELS[framework]} at N={n}, load {load}: {note}")
                    print(f"  skipped/failed: {note}", file=sys.stderr, flush=True)
    elapsed = time.time() - started
    if versions:
        print("Versions: " + "; ".join(f"{LABELS[k]}: {v}" for k, v in versions.items()) + "\n")
    print(
        "Cells: bus bandwidth in GB/s (1e9 B/s) and the median time per op (max over ranks per iteration). "
        "hora/X = hora's busbw / X's busbw = X's time / hora's time (> 1: hora is faster).\n"
    )
    print(tables(args, results))
    wrong = [r for r in results if not r["ok"]]
    for r in wrong:
        notes.append(
            f"{LABELS[r['framework']]} {r['op']} {format_size(r['size'])} N={r['np']} returned a wrong result"
        )
    finish(notes, elapsed, args.json, {
        "machine": {**machine(), "copy_GBps": copy_gbps},
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "label")},
        "versions": versions,
        "results": results,
    })  # fmt: skip
    return 1 if wrong or (notes and not results) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"message sizes, K/M/G binary (default {DEFAULT_SIZES})"
    )
    p.add_argument("--ops", default=",".join(OPS), help="collectives to run (default: all of %(default)s)")
    p.add_argument("--np", default="2,4", help="rank counts (default 2,4)")
    p.add_argument(
        "--frameworks",
        default="hora,gloo,mpi",
        help=f"frameworks, in run order, from {','.join(FRAMEWORKS)} (default %(default)s)",
    )
    p.add_argument("--tcp", action="store_true", help="also run hora over its tcp transport (adds hora-tcp)")
    p.add_argument(
        "--iters", type=int, default=0, help="fixed timed iterations per measurement (default: adaptive)"
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed iterations before timing (default 2, at least 1)"
    )
    p.add_argument(
        "--min-time", type=float, default=0.5, help="adaptive: seconds of timed ops to aim for (0.5)"
    )
    p.add_argument("--min-iters", type=int, default=3, help="adaptive: fewest timed iterations (3)")
    p.add_argument("--max-iters", type=int, default=200, help="adaptive: most timed iterations (200)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one framework at one N may take (900)")
    p.add_argument(
        "--mpirun-args",
        default="--oversubscribe --bind-to none",
        help="extra mpirun options (default: %(default)r, like the unbound hora and gloo workers)",
    )
    p.add_argument(
        "--load", type=int, default=0, metavar="K",
        help="also measure with K foreign busy processes on the machine, right after each quiet measurement",
    )  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="also write every result as JSON")
    p.add_argument("--worker", choices=["hora", "gloo", "mpi"], help=argparse.SUPPRESS)
    p.add_argument("--label", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        p.error(f"unknown op(s) {bad}; choose from {', '.join(OPS)}")
    if args.worker:
        args.label = args.label or args.worker
        return worker(args)
    try:
        args.np = parse_counts(args.np)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if args.tcp and "hora-tcp" not in args.frameworks:
        args.frameworks.insert(
            args.frameworks.index("hora") + 1 if "hora" in args.frameworks else 0, "hora-tcp"
        )
    bad = [f for f in args.frameworks if f not in FRAMEWORKS]
    if bad:
        p.error(f"unknown framework(s) {bad}; choose from {', '.join(FRAMEWORKS)}")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
