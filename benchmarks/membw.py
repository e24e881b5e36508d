"""Memory-traffic limit of this machine, and what it allows hora's shared-memory allreduce.

STREAM-like kernels on numpy arrays (default 256 MiB each), in one process and in P processes at once (default
P = 1 and 2; use the number of cores): copy (``np.copyto(dst, src)``, 8 bytes counted per float32: read + write)
and add (``np.add(a, b, out=c)``, 12 bytes: two reads + one write). GB/s = 1e9 bytes counted per second, summed
over the processes; every repetition starts at a barrier and lasts until the slowest process is done; the best
repetition is reported (STREAM's convention), the median beside it.

Then the bound for hora's shared-memory allreduce at N ranks (``src/hora/_transport/shm.py``, ``_reduce``), per
rank and per input byte:

    stage   copy (N-1)/N of the input into the rank's slot          2(N-1)/N   (read + write)
    reduce  the owner's 1/N slice over N inputs; numpy does N-1     3(N-1)/N   (ideal, one pass: (N+1)/N)
            binary ops of 2 reads + 1 write on 1/N each
    gather  copy all N reduced slices out of the slots              2          (read 1 + write 1)
    m(N) = (7N-5)/N bytes moved per input byte: 4.5 at N=2, 5.75 at N=4

All N ranks share the machine's memory bandwidth B (copy traffic with P processes), so if every byte went to DRAM

    algbw <= B / (N * m(N))                                  ("traffic bound")

The staging slots are small (2 buffers x HORA_SHM_CHUNK_BYTES per rank, 2 MiB by default) and are read right
after they are written, so when 2 * N * chunk fits in the last-level cache they never reach DRAM. What must reach
DRAM is the input (read once) and the output (written once):

    algbw <= B / (N * 2)                                     ("DRAM bound", slots in cache)

With ``--collectives RESULTS.json`` (from ``collectives.py --json``) it prints, for every hora allreduce measured,
the fraction of both bounds it reached.

    python benchmarks/membw.py                                         # 256 MiB arrays, P = 1 and 2
    python benchmarks/membw.py --collectives /tmp/bench.json           # also: hora's % of the bounds
    python benchmarks/membw.py --size 16M --repeats 3                  # smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Any

import numpy as np
from _common import format_gbps, format_size, machine, parse_counts, parse_size

KERNELS = {"copy": 2, "add": 3}  # arrays touched per element: bytes counted = this x 4 per float32
DEFAULT_CHUNK = 2 << 20  # hora's default HORA_SHM_CHUNK_BYTES


# -- measurement ---------------------------------------------------------------------------------------------------
def _kernel(kernel: str, nbytes: int, repeats: int, barrier: Any, out: Any) -> None:
    """One process: allocate and touch the arrays, then time ``repeats`` kernels, each after a barrier."""
    count = nbytes // 4
    a = np.ones(count, np.float32)
    b = np.full(count, 2.0, np.float32)
    c = np.zeros(count, np.float32)

    def run() -> None:
        if kernel == "copy":
            np.copyto(c, a)
        else:
            np.add(a, b, out=c)

    run()  # every page faulted in before timing
    times = []
    for _ in range(repeats):
        barrier.wait()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    out.put(times)


def measure(kernel: str, nbytes: int, procs: int, repeats: int) -> dict[str, Any]:
    """Run ``kernel`` in ``procs`` processes at once; GB/s counted as bytes read + written, summed over them."""
    if "fork" in multiprocessing.get_all_start_methods():  # fork: no re-import of this script per process
        ctx: Any = multiprocessing.get_context("fork")
    else:
        ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [
        ctx.Process(target=_kernel, args=(kernel, nbytes, repeats, barrier, out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    try:
        per_proc = [out.get(timeout=600) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    slowest = np.max(np.array(per_proc), axis=0)  # per repetition: until the last process is done
    counted = procs * KERNELS[kernel] * (nbytes // 4) * 4
    rates = counted / slowest / 1e9
    return {
        "kernel": kernel,
        "procs": procs,
        "array_bytes": nbytes,
        "bytes_counted_per_repeat": counted,
        "best_GBps": float(rates.max()),
        "median_GBps": float(np.median(rates)),
        "times_s": [float(t) for t in slowest],
    }


# -- the allreduce model -------------------------------------------------------------------------------------------
def moved_per_input_byte(n: int) -> dict[str, float]:
    """Bytes hora's shm allreduce moves per rank and per input byte at N ranks, by phase (see the docstring)."""
    return {
        "stage": 2 * (n - 1) / n,
        "reduce": 3 * (n - 1) / n if n > 1 else 0.0,
        "reduce_ideal": (n + 1) / n if n > 1 else 0.0,
        "gather": 2.0 if n > 1 else 0.0,
    }


def bounds(n: int, bandwidth: float) -> dict[str, float]:
    """Best algbw (GB/s) of hora's shm allreduce at N ranks given the machine's total memory traffic (GB/s)."""
    phases = moved_per_input_byte(n)
    m = phases["stage"] + phases["reduce"] + phases["gather"]
    m_ideal = phases["stage"] + phases["reduce_ideal"] + phases["gather"]
    return {
        "moved_per_input_byte": m,
        "moved_per_input_byte_ideal_reduce": m_ideal,
        "traffic_bound_GBps": bandwidth / (n * m) if m else float("inf"),
        "dram_bound_GBps": bandwidth / (n * 2) if n > 1 else float("inf"),
    }


def last_level_cache() -> int | None:
    """Bytes of the largest CPU cache Linux reports (None elsewhere)."""
    best = None
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(root)
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "size")) as f:
                size = parse_size(f.read().strip())
        except (OSError, argparse.ArgumentTypeError):
            continue
        best = size if best is None or size > best else best
    return best


def shm_chunk() -> int:
    """HORA_SHM_CHUNK_BYTES as hora would resolve it here (its default when hora is not importable)."""
    try:
        from hora.config import Config

        return int(Config.resolve().shm_chunk_bytes)
    except Exception:
        value = os.environ.get("HORA_SHM_CHUNK_BYTES", "")
        return int(value) if value.isdigit() else DEFAULT_CHUNK


def bandwidth_for(n: int, copy: dict[int, dict[str, Any]]) -> tuple[int, float]:
    """The copy traffic that N ranks share: measured with the most processes P <= N (N ranks on P cores)."""
    p = max((q for q in copy if q <= n), default=min(copy))
    return p, copy[p]["best_GBps"]


# -- report --------------------------------------------------------------------------------------------------------
def report(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for procs in args.procs:
        for kernel in KERNELS:
            print(f"  {kernel} in {procs} process(es) ...", file=sys.stderr, flush=True)
            results.append(measure(kernel, args.size, procs, args.repeats))
    print(
        f"# Memory bandwidth: arrays of {args.size / 2**20:g} MiB (float32), best of {args.repeats} "
        f"(median in parentheses), GB/s = 1e9 bytes read + written per second, summed over the processes\n"
    )
    m = machine()
    print(f"Machine: {m['node']}, {m['cpus']} CPUs, Python {m['python']}, numpy {m['numpy']}.\n")
    header = ["kernel", "bytes counted per element", *(f"P = {p}" for p in args.procs)]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * len(args.procs)) + "|",
    ]
    counted = {"copy": "8 (read 4 + write 4)", "add": "12 (read 8 + write 4)"}
    for kernel, text in (("copy", "copy `np.copyto(dst, src)`"), ("add", "add `np.add(a, b, out=c)`")):
        cells = []
        for p in args.procs:
            r = next(x for x in results if x["kernel"] == kernel and x["procs"] == p)
            cells.append(f"{format_gbps(r['best_GBps'])} ({format_gbps(r['median_GBps'])})")
        lines.append(f"| {text} | {counted[kernel]} | " + " | ".join(cells) + " |")
    print("\n".join(lines) + "\n")

    copy = {r["procs"]: r for r in results if r["kernel"] == "copy"}
    llc, chunk = last_level_cache(), args.chunk or shm_chunk()
    print("## The limit for hora's shared-memory allreduce\n")
    print(
        "Per rank and per input byte, the shm allreduce moves m(N) = 2(N-1)/N (stage into the slot) + 3(N-1)/N "
        "(owner reduces its 1/N slice: N-1 numpy ops of 2 reads + 1 write) + 2 (copy all slices out) = "
        "(7N-5)/N bytes. All N ranks share the memory traffic B (copy, P processes), so:\n"
        "- traffic bound (every byte through DRAM): algbw <= B / (N * m(N))\n"
        "- DRAM bound (staging slots stay in cache; only the input read and the output write reach DRAM): "
        "algbw <= B / (2N)\n"
        "busbw = algbw * 2(N-1)/N, as in collectives.py.\n"
    )
    bound_rows = [
        "| N | B used (GB/s) | m(N) | traffic bound algbw (busbw) | DRAM bound algbw (busbw) | slots 2*N*chunk |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    derived: dict[int, dict[str, Any]] = {}
    for n in args.np:
        p, bw = bandwidth_for(n, copy)
        b = bounds(n, bw)
        slots = 2 * n * chunk
        fits = "—" if llc is None else ("fits in" if slots <= llc else "exceeds") + f" {format_size(llc)} LLC"
        factor = 2 * (n - 1) / n
        derived[n] = {"procs": p, "B_GBps": bw, "slots_bytes": slots, **b}
        bound_rows.append(
            f"| {n} | {format_gbps(bw)} (P = {p}) | {b['moved_per_input_byte']:.3g} | "
            f"{format_gbps(b['traffic_bound_GBps'])} ({format_gbps(b['traffic_bound_GBps'] * factor)}) | "
            f"{format_gbps(b['dram_bound_GBps'])} ({format_gbps(b['dram_bound_GBps'] * factor)}) | "
            f"{format_size(slots)}, {fits} |"
        )
    print("\n".join(bound_rows) + "\n")
    print(
        f"chunk = HORA_SHM_CHUNK_BYTES = {format_size(chunk)}. When the slots fit in the last-level cache the DRAM "
        "bound is the one that applies; a result above the traffic bound shows they did.\n"
    )
    reached = []
    if args.collectives:
        with open(args.collectives) as f:
            data = json.load(f)
        recs = [
            r
            for r in data.get("results", [])
            if r.get("framework") == "hora" and r.get("op") == "allreduce" and r.get("ok")
        ]
        rows = [
            "| N | size | hora algbw GB/s | % of traffic bound | % of DRAM bound |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(recs, key=lambda r: (r["np"], r["size"])):
            n = r["np"]
            if n < 2 or r["size"] < 1 << 20:
                continue
            if n not in derived:
                p, bw = bandwidth_for(n, copy)
                derived[n] = {"procs": p, "B_GBps": bw, **bounds(n, bw)}
            d = derived[n]
            pct_t = 100 * r["algbw_GBps"] / d["traffic_bound_GBps"]
            pct_d = 100 * r["algbw_GBps"] / d["dram_bound_GBps"]
            reached.append(
                {
                    "np": n,
                    "size": r["size"],
                    "algbw_GBps": r["algbw_GBps"],
                    "pct_traffic": pct_t,
                    "pct_dram": pct_d,
                }
            )
            rows.append(
                f"| {n} | {format_size(r['size'])} | {format_gbps(r['algbw_GBps'])} | {pct_t:.0f}% | {pct_d:.0f}% |"
            )
        print(f"### hora allreduce from {args.collectives} against these bounds (sizes from 1 MiB)\n")
        print("\n".join(rows) + "\n")
        for n in sorted({x["np"] for x in reached}):
            top = max((x for x in reached if x["np"] == n), key=lambda x: x["size"])
            print(
                f"At N = {n}, {format_size(top['size'])}: hora reaches {top['pct_traffic']:.0f}% of the traffic "
                f"bound and {top['pct_dram']:.0f}% of the DRAM bound."
            )
        print()
        print(
            "Only the large sizes (16M and up) are bandwidth-bound; below that the fixed cost per collective "
            "dominates. The collective results should come from the same machine state as these numbers.\n"
        )
    return {
        "machine": m,
        "args": vars(args),
        "last_level_cache_bytes": llc,
        "shm_chunk_bytes": chunk,
        "results": results,
        "bounds": {str(n): d for n, d in derived.items()},
        "hora_reached": reached,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("256M"), help="bytes per array (256M)")
    p.add_argument(
        "--procs",
        default="1,2",
        help="process counts to measure, all at once each (default 1,2; the largest should be the core count)",
    )
    p.add_argument("--repeats", type=int, default=10, help="timed repetitions per kernel (default 10)")
    p.add_argument("--np", default="2,4", help="rank counts to derive the allreduce bounds for (default 2,4)")
    p.add_argument(
        "--chunk",
        type=parse_size,
        default=None,
        help="hora's HORA_SHM_CHUNK_BYTES for the cache check (default: as hora resolves it here)",
    )
    p.add_argument(
        "--collectives", metavar="JSON", help="collectives.py --json output: print hora's % of bounds"
    )
    p.add_argument("--json", metavar="PATH", help="also write the measurements and bounds as JSON")
    args = p.parse_args(argv)
    try:
        args.procs = sorted(set(parse_counts(args.procs, "--procs")))
        args.np = parse_counts(args.np)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    out = report(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"Wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
