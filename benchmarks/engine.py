"""Engine benchmark: a training step of many small allreduces (hora fused/unfused, gloo, Open MPI), interleaved.

The step is Horovod's DistributedOptimizer pattern: submit every gradient with an asynchronous, named, in-place
allreduce (``allreduce_async_(grad, name=...)``), then synchronize them all. Default: 200 tensors of 16 KiB float32
(3.28 MB per step). Variants:

    hora-fused      hora (shared memory), default engine settings (tensor fusion on)
    hora-unfused    the same with HORA_FUSION_THRESHOLD=0 (fusion off)
    hora-grouped    hora: one grouped_allreduce_async_ of the step's tensors (one request for all of them)
    hora-one        one hora allreduce of the whole step's bytes: the lower bound for the step
    gloo-each       torch.distributed gloo: all_reduce(async_op=True) per tensor, then wait for all
    gloo-one        gloo: one all_reduce of the whole step's bytes
    mpi-each        Open MPI via mpi4py: Iallreduce per tensor, then Waitall (skipped without mpirun/mpi4py)
    mpi-one         Open MPI: one Allreduce of the whole step's bytes

Driver (default)::

    python benchmarks/engine.py                     # N = 2, every variant, 3 rounds
    python benchmarks/engine.py --np 2,4 --json /tmp/engine.json
    python benchmarks/engine.py --steps 6 --warmup 1 --rounds 2 --tensors 20      # smoke run

Autotune against a grid search (issue 14: autotune should end within 5 % of the grid's best point)::

    python benchmarks/engine.py --grid                  # every grid point, then hora with HORA_AUTOTUNE=1
    python benchmarks/engine.py --grid --grid-fusion-mb 0,4,64 --grid-cycle-ms 1 --grid-cache 1 \
        --hora-env HORA_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=6 --steps 4 --warmup 1 --rounds 1 --tensors 20  # smoke

``--grid`` runs ``hora-fused`` once per point of fusion threshold x cycle time x cache (on: the default capacity,
off: HORA_CACHE_CAPACITY=0) and the variant ``hora-autotune``: hora started from the default settings with
HORA_AUTOTUNE=1, which steps untimed until rank 0's autotune log holds its chosen point, then is timed like the
others with the settings autotune kept. The verdict compares its median step with the best grid point's.
``--autotune`` adds only the ``hora-autotune`` variant to the usual ones.

Engine settings are environment variables, so variants with different settings are separate launches. Variants
that share a launch (hora-fused and hora-one; gloo-each and gloo-one; mpi-each and mpi-one) alternate step by
step inside it; the launches alternate round-robin for ``--rounds`` rounds (the first launch rotates each round),
each round running ``steps/rounds`` timed steps per variant after ``--warmup`` untimed ones, so machine noise hits
every variant alike. Every timed step starts after a barrier (not timed) and is timed on every rank; the slowest
rank's time per step is kept, and the median and 90th percentile over all rounds' steps reported.

Worker (``--worker hora|gloo|mpi``): runs inside every rank and prints ``HORA_BENCH {json}`` lines from rank 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from _common import (
    emit,
    finish,
    format_time,
    hora_command,
    machine,
    mpi_env,
    mpirun_command,
    parse_counts,
    pattern,
    run_ranks,
    torch_missing,
)


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str  # as the table shows it
    group: str  # the launch it runs in
    mode: str  # "each": tensor by tensor; "grouped": one grouped call; "one": one tensor of the step's total size


VARIANTS = {
    "hora-fused": Variant("hora fused", "hora", "each"),
    "hora-unfused": Variant("hora unfused (HORA_FUSION_THRESHOLD=0)", "hora-unfused", "each"),
    "hora-grouped": Variant("hora grouped_allreduce (one request)", "hora", "grouped"),
    "hora-one": Variant("hora one allreduce", "hora", "one"),
    "gloo-each": Variant("gloo tensor by tensor", "gloo", "each"),
    "gloo-one": Variant("gloo one tensor", "gloo", "one"),
    "mpi-each": Variant("Open MPI Iallreduce each", "mpi", "each"),
    "mpi-one": Variant("Open MPI one Allreduce", "mpi", "one"),
}
AUTOTUNE = Variant("hora autotuned (HORA_AUTOTUNE=1)", "hora-autotune", "each")
GROUP_WORKER = {"hora": "hora", "hora-unfused": "hora", "hora-autotune": "hora", "gloo": "gloo", "mpi": "mpi"}
GROUP_ENV: dict[str, dict[str, str]] = {}  # engine settings of a launch group (the grid points)
AUTOTUNE_SLACK = 1.05  # autotune's step should be within 5 % of the best grid point's
BASELINE = "hora-one"
TARGET = 1.5  # hora fused should take at most this many times the one-allreduce step (issue 14)
# Engine settings the hora launches start from scratch (their defaults), so the shell cannot skew "default".
ENGINE_VARS = tuple(
    f"{prefix}_{name}"
    for prefix in ("HORA", "HOROVOD")
    for name in (
        "FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY", "AUTOTUNE", "AUTOTUNE_LOG", "AUTOTUNE_WARMUP_SAMPLES",
        "AUTOTUNE_STEPS_PER_SAMPLE", "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
    )
)  # fmt: skip


# -- workers -------------------------------------------------------------------------------------------------------
class Stepper:
    """One framework's step: ``each`` reduces a list of tensors tensor by tensor, ``one`` a single buffer."""

    rank = 0
    size = 1

    def each(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def one(self, buf: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def grouped(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        """The step's tensors in one grouped call (hora only)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def max_all(self, values: np.ndarray) -> np.ndarray:
        """Element-wise maximum of a float64 array across ranks (not timed)."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class HoraStepper(Stepper):
    def __init__(self, out_of_place: bool) -> None:
        import hora
        import hora.numpy as hvd

        self.hvd, self.version = hvd, hora.__version__
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.submit = hvd.allreduce_async if out_of_place else hvd.allreduce_async_

    def each(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        hvd = self.hvd
        handles = [self.submit(t, op=hvd.Sum, name=f"grad.{i}") for i, t in enumerate(tensors)]
        return [hvd.synchronize(h) for h in handles]

    def one(self, buf: np.ndarray) -> np.ndarray:
        return self.hvd.synchronize(self.submit(buf, op=self.hvd.Sum, name="grad.all"))

    def grouped(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        hvd = self.hvd
        start = hvd.grouped_allreduce_async if self.submit is hvd.allreduce_async else hvd.grouped_allreduce_async_
        return hvd.synchronize(start(tensors, op=hvd.Sum, name="grads"))

    def barrier(self) -> None:
        self.hvd.barrier()

    def max_all(self, values: np.ndarray) -> np.ndarray:
        return self.hvd.allreduce(values, op=self.hvd.Max, name="bench.max")

    def info(self) -> dict[str, Any]:
        """hora's version and the engine settings in effect (None: this hora has no such setting)."""
        settings: dict[str, Any] = {}
        try:
            from hora.config import Config

            config = Config.resolve()
            fields = {e: f.name for f in dataclasses.fields(Config) for e in f.metadata.get("env", ())}
            for var in ("HORA_FUSION_THRESHOLD", "HORA_CYCLE_TIME", "HORA_CACHE_CAPACITY"):
                settings[var] = getattr(config, fields[var]) if var in fields else None
        except Exception as exc:  # the report should still come out if hora's config module changes
            settings["error"] = repr(exc)
        return {"version": self.version, "settings": settings}

    def close(self) -> None:
        self.hvd.shutdown()


class GlooStepper(Stepper):
    def __init__(self) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self._tensors: dict[int, Any] = {}

    def _t(self, arr: np.ndarray) -> Any:
        # torch.from_numpy shares memory; cache so the timed loop does not build a tensor object per call.
        key = arr.__array_interface__["data"][0]
        t = self._tensors.get(key)
        if t is None or t.numel() != arr.size:
            t = self._tensors[key] = self.torch.from_numpy(arr)
        return t

    def each(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        dist = self.dist
        works = [dist.all_reduce(self._t(t), op=dist.ReduceOp.SUM, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        return tensors

    def one(self, buf: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(self._t(buf), op=self.dist.ReduceOp.SUM)
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


class MpiStepper(Stepper):
    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def each(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        MPI = self.MPI
        requests = [self.comm.Iallreduce(MPI.IN_PLACE, t, op=MPI.SUM) for t in tensors]
        MPI.Request.Waitall(requests)
        return tensors

    def one(self, buf: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_all(self, values: np.ndarray) -> np.ndarray:
        out = values.copy()
        self.comm.Allreduce(self.MPI.IN_PLACE, out, op=self.MPI.MAX)
        return out

    def info(self) -> dict[str, Any]:
        import mpi4py

        library = self.MPI.Get_library_version().replace("\0", "").split(",")[0].strip()
        return {"version": f"{library}; mpi4py {mpi4py.__version__}"}


def check(stepper: Stepper, mode: str, tensors: list[np.ndarray], big: np.ndarray) -> bool:
    """One step on a known pattern (tensor i on rank r holds (r+1)*p + i), compared on every element."""
    n, r = stepper.size, stepper.rank
    count = tensors[0].size
    expect_each = [pattern(count, scale=n * (n + 1) / 2, offset=n * (i % 64)) for i in range(len(tensors))]
    if mode in ("each", "grouped"):
        for i, t in enumerate(tensors):
            t[:] = pattern(count, scale=r + 1, offset=i % 64)
        results = stepper.each(tensors) if mode == "each" else stepper.grouped(tensors)
        ok = all(np.array_equal(got, want) for got, want in zip(results, expect_each))
    else:
        for i in range(len(tensors)):
            big[i * count : (i + 1) * count] = pattern(count, scale=r + 1, offset=i % 64)
        ok = bool(np.array_equal(stepper.one(big), np.concatenate(expect_each)))
    for t in tensors:
        t.fill(0.0)  # timed on zeros: in-place sums stay finite however many steps run
    big.fill(0.0)
    return ok


def mode_of(key: str) -> str:
    """A variant's mode; the grid points and hora-autotune are registered only in the driver, and step tensor by
    tensor."""
    return VARIANTS[key].mode if key in VARIANTS else "each"


def tune(stepper: Stepper, step: Any, log: str, limit: int = 20_000) -> dict[str, Any]:
    """Step until autotune has written its chosen point (the log's last row, after one row per scored sample);
    rank 0 reads the log and every rank learns from an allreduce every 10 steps. Returns what the log says."""
    from hora.config import Config

    rows = Config.resolve().autotune_bayes_opt_max_samples + 1
    steps, lines = 0, []
    while steps < limit:
        for _ in range(10):
            step()
        steps += 10
        if stepper.rank == 0 and os.path.exists(log):
            with open(log) as f:
                lines = f.read().splitlines()
        if stepper.max_all(np.array([1.0 if len(lines) > rows else 0.0]))[0] > 0:
            break
    return {"steps": steps, "chosen": lines[-1] if len(lines) > rows else None, "log": lines}


def worker(args: argparse.Namespace) -> int:
    stepper: Stepper
    if args.worker == "hora":
        stepper = HoraStepper(args.out_of_place)
    elif args.worker == "gloo":
        stepper = GlooStepper()
    else:
        stepper = MpiStepper()
    keys = args.variants.split(",")
    count = args.tensor_kb * 1024 // 4
    # Separate arrays, as gradients are: fusing them means copying them into (and out of) one buffer.
    tensors = [np.zeros(count, np.float32) for _ in range(args.tensors)]
    big = np.zeros(count * args.tensors, np.float32)
    emit(stepper.rank, {"kind": "start", "group": args.group, "np": stepper.size, **stepper.info()})

    def step(key: str) -> None:
        mode = mode_of(key)
        if mode == "each":
            stepper.each(tensors)
        elif mode == "grouped":
            stepper.grouped(tensors)
        else:
            stepper.one(big)

    if args.tune_log:  # autotune first: untimed steps until rank 0's log holds the point it kept
        tuned = tune(stepper, lambda: step(keys[0]), args.tune_log)
        emit(stepper.rank, {"kind": "tuned", "group": args.group, **tuned})
    ok = {key: check(stepper, mode_of(key), tensors, big) for key in keys}
    bad = stepper.max_all(np.array([0.0 if ok[key] else 1.0 for key in keys]))
    clock = time.perf_counter
    for _ in range(args.warmup):
        for key in keys:
            stepper.barrier()
            step(key)
    times = {key: np.zeros(args.steps) for key in keys}
    for i in range(args.steps):
        for key in keys:  # alternate the variants of this launch step by step
            stepper.barrier()
            t0 = clock()
            step(key)
            times[key][i] = clock() - t0
    for j, key in enumerate(keys):
        slowest = stepper.max_all(times[key])  # per step, the slowest rank
        emit(
            stepper.rank,
            {
                "kind": "result",
                "variant": key,
                "np": stepper.size,
                "round": args.round,
                "ok": bool(bad[j] == 0.0),
                "times_s": [float(x) for x in slowest],
            },
        )
    stepper.barrier()
    emit(stepper.rank, {"kind": "done", "group": args.group})
    stepper.close()
    return 0


# -- driver --------------------------------------------------------------------------------------------------------
def launch(
    args: argparse.Namespace, group: str, variants: list[str], n: int, steps: int, round_: int
) -> tuple[list[str], dict[str, str]] | str:
    """The command and environment of one launch, or why it is skipped."""
    kind = GROUP_WORKER[group]
    worker_args = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        kind,
        "--group",
        group,
        "--variants",
        ",".join(variants),
        "--tensors",
        str(args.tensors),
        "--tensor-kb",
        str(args.tensor_kb),
        "--steps",
        str(steps),
        "--warmup",
        str(args.warmup),
        "--round",
        str(round_),
    ]
    if args.out_of_place:
        worker_args.append("--out-of-place")
    env = dict(os.environ)
    if kind == "hora":
        for var in ENGINE_VARS:
            env.pop(var, None)
        env.update(args.hora_env)
        env.update(GROUP_ENV.get(group, {}))
        env["HORA_TRANSPORT"] = "shm"
        if group == "hora-unfused":
            env["HORA_FUSION_THRESHOLD"] = "0"
        if group == "hora-autotune":
            log = os.path.join(args.tune_dir, f"autotune-np{n}-round{round_}.csv")
            env.update({"HORA_AUTOTUNE": "1", "HORA_AUTOTUNE_LOG": log})
            worker_args += ["--tune-log", log]
        return hora_command(n, "shm") + worker_args, env
    if kind == "gloo":
        missing = torch_missing()
        return missing if missing else (hora_command(n) + worker_args, env)
    cmd = mpirun_command(n, args.mpirun_args)
    return cmd if isinstance(cmd, str) else (cmd + worker_args, mpi_env(env))


def summarize(times: list[float]) -> dict[str, float]:
    a = np.asarray(times)
    return {
        "median_s": float(np.median(a)),
        "p90_s": float(np.percentile(a, 90)),
        "min_s": float(a.min()),
        "max_s": float(a.max()),
        "steps": len(a),
    }


def table(args: argparse.Namespace, n: int, summary: dict[str, dict[str, Any]]) -> str:
    total = args.tensors * args.tensor_kb * 1024
    base = summary.get(BASELINE)
    lines = [
        f"### N = {n}: {args.tensors} tensors x {args.tensor_kb} KiB float32 = {total / 1e6:.2f} MB per step",
        "",
        "| variant | median ms/step | p90 ms/step | x hora one allreduce | per tensor | algbw GB/s "
        "| steps | round medians (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in args.variants:
        s, label = summary.get(key), VARIANTS[key].label
        if s is None:
            lines.append(f"| {label} | — | — | — | — | — | 0 | — |")
            continue
        if not s["ok"]:
            lines.append(f"| {label} | WRONG RESULT | | | | | {s['steps']} | |")
            continue
        ratio = f"{s['median_s'] / base['median_s']:.2f}x" if base and base["ok"] else "—"
        each = VARIANTS[key].mode != "one"
        per_tensor = format_time(s["median_s"] / args.tensors) if each else "—"
        rounds = " / ".join(f"{x * 1e3:.3g}" for x in s["round_medians_s"])
        lines.append(
            f"| {label} | {s['median_s'] * 1e3:.3g} | {s['p90_s'] * 1e3:.3g} | {ratio} | {per_tensor} | "
            f"{total / s['median_s'] / 1e9:.3g} | {s['steps']} | {rounds} |"
        )
    lines.append("")
    fused = summary.get("hora-fused")
    if fused and base and fused["ok"] and base["ok"]:
        r = fused["median_s"] / base["median_s"]
        verdict = "met" if r <= TARGET else "NOT met"
        lines.append(
            f"Target: hora fused ≤ {TARGET}x hora one allreduce (median per step): {r:.2f}x — {verdict}."
        )
        grouped = summary.get("hora-grouped")
        if grouped and grouped["ok"]:
            g = grouped["median_s"] / base["median_s"]
            lines.append(f"hora grouped (one request for the step): {g:.2f}x hora one allreduce.")
        unfused = summary.get("hora-unfused")
        if unfused and unfused["ok"]:
            lines.append(
                f"Fusion speed-up: hora unfused / hora fused = {unfused['median_s'] / fused['median_s']:.2f}x."
            )
        lines.append("")
    grid = {k: v for k, v in summary.items() if k in GROUP_ENV and v["ok"]}
    tuned = summary.get("hora-autotune")
    if grid and tuned and tuned["ok"]:
        best = min(grid, key=lambda k: grid[k]["median_s"])
        r = tuned["median_s"] / grid[best]["median_s"]
        verdict = "met" if r <= AUTOTUNE_SLACK else "NOT met"
        lines.append(
            f"Target: hora autotuned within {AUTOTUNE_SLACK - 1:.0%} of the best grid point ({VARIANTS[best].label}, "
            f"{grid[best]['median_s'] * 1e3:.3g} ms/step): {r:.3f}x — {verdict}. Autotune kept (per round): "
            + "; ".join(str(c) for c in tuned.get("chosen", [])) + "."
        )
        lines.append("")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    started = time.time()
    steps = math.ceil(args.steps / args.rounds)
    groups: list[str] = []
    for key in args.variants:
        if VARIANTS[key].group not in groups:
            groups.append(VARIANTS[key].group)
    total = args.tensors * args.tensor_kb * 1024
    print(
        f"# Engine benchmark: {args.tensors} tensors x {args.tensor_kb} KiB float32 ({total / 1e6:.2f} MB) per step; "
        f"N = {', '.join(map(str, args.np))}; {args.rounds} rounds x {steps} timed steps per variant after "
        f"{args.warmup} warm-up steps\n",
        flush=True,
    )
    m = machine()
    print(f"Machine: {m['node']}, {m['cpus']} CPUs, Python {m['python']}, numpy {m['numpy']}.\n", flush=True)
    raw: list[dict[str, Any]] = []
    tuned: list[dict[str, Any]] = []  # what autotune kept, per launch
    starts: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for n in args.np:
        for r in range(args.rounds):
            for g in groups[r % len(groups) :] + groups[: r % len(groups)]:
                variants = [v for v in args.variants if VARIANTS[v].group == g]
                print(
                    f"[{time.time() - started:6.0f}s] N={n} round {r + 1}/{args.rounds}: {', '.join(variants)}",
                    file=sys.stderr,
                    flush=True,
                )
                cmd = launch(args, g, variants, n, steps, r)
                if isinstance(cmd, str):
                    if r == 0:
                        notes.append(f"{', '.join(variants)} at N={n}: skipped: {cmd}")
                        print(f"  skipped: {cmd}", file=sys.stderr, flush=True)
                    continue

                def progress(rec: dict[str, Any]) -> None:
                    if rec["kind"] == "result":
                        flag = "" if rec["ok"] else "  WRONG RESULT"
                        print(
                            f"  {rec['variant']:>12}: median {np.median(rec['times_s']) * 1e3:8.3f} ms/step "
                            f"({len(rec['times_s'])} steps){flag}",
                            file=sys.stderr,
                            flush=True,
                        )

                records, note = run_ranks(*cmd, timeout=args.timeout, on_record=progress)
                for rec in records:
                    if rec["kind"] == "start":
                        starts[g] = rec
                    elif rec["kind"] == "tuned":
                        tuned.append({"np": n, "round": r, **rec})
                        print(f"  autotune kept {rec['chosen']} after {rec['steps']} steps", file=sys.stderr)
                    elif rec["kind"] == "result":
                        raw.append(rec)
                if note:
                    notes.append(f"{', '.join(variants)} at N={n}, round {r + 1}: {note}")
                    print(f"  failed: {note}", file=sys.stderr, flush=True)
    elapsed = time.time() - started

    summaries: dict[int, dict[str, dict[str, Any]]] = {}
    for n in args.np:
        for key in args.variants:
            recs = [x for x in raw if x["np"] == n and x["variant"] == key]
            if recs:
                times = [t for x in recs for t in x["times_s"]]
                summaries.setdefault(n, {})[key] = {
                    **summarize(times),
                    "ok": all(x["ok"] for x in recs),
                    "round_medians_s": [float(np.median(x["times_s"])) for x in recs],
                }
                if key == "hora-autotune":
                    summaries[n][key]["chosen"] = [t["chosen"] for t in tuned if t["np"] == n]
    versions = {g: s.get("version", "") for g, s in starts.items()}
    if versions:
        shown = {"hora": next((v for g, v in versions.items() if GROUP_WORKER.get(g) == "hora" and v), None)}
        shown.update({"gloo": versions.get("gloo"), "Open MPI": versions.get("mpi")})
        print("Versions: " + "; ".join(f"{k}: {v}" for k, v in shown.items() if v) + "\n")
    for g in ("hora", "hora-unfused"):
        if g in starts:
            settings = starts[g].get("settings", {})
            print(f"Engine settings in effect for the {g} launch: {json.dumps(settings)}")
            if g == "hora-unfused" and settings.get("HORA_FUSION_THRESHOLD", 0) is None:
                notes.append(
                    "this hora does not know HORA_FUSION_THRESHOLD: 'hora fused' and 'hora unfused' run the same engine"
                )
    print(
        "\nCells: time per step = the slowest rank's time from submitting the first tensor to having synchronized "
        "the last, median and 90th percentile over all rounds' steps. per tensor = median / tensors. "
        "algbw = bytes per step / median. round medians: each round's median, to show the run-to-run spread.\n"
    )
    for n in args.np:
        print(table(args, n, summaries.get(n, {})))
    wrong = [f"{key} at N={n}" for n, s in summaries.items() for key, v in s.items() if not v["ok"]]
    notes += [f"{w} returned a wrong result" for w in wrong]
    finish(notes, elapsed, args.json, {
        "machine": m,
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "group", "round", "tune_log")},
        "starts": starts,
        "summary": {str(n): s for n, s in summaries.items()},
        "results": raw,
        "autotune": tuned,
    })  # fmt: skip
    return 1 if wrong or not raw else 0


def grid_variants(fusion_mb: str, cycle_ms: str, cache: str) -> list[str]:
    """Register one hora-fused launch per grid point; returns their variant keys."""
    keys = []
    for mb, ms, on in itertools.product(fusion_mb.split(","), cycle_ms.split(","), cache.split(",")):
        mb, ms, on = float(mb), float(ms), int(on)
        key = f"grid-f{mb:g}-c{ms:g}-k{on}"
        VARIANTS[key] = Variant(f"hora fused, {mb:g} MiB, {ms:g} ms, cache {'on' if on else 'off'}", key, "each")
        GROUP_WORKER[key] = "hora"
        GROUP_ENV[key] = {"HORA_FUSION_THRESHOLD": str(int(mb * 2**20)), "HORA_CYCLE_TIME": f"{ms:g}"}
        if not on:
            GROUP_ENV[key]["HORA_CACHE_CAPACITY"] = "0"
        keys.append(key)
    return keys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2", help="rank counts, comma-separated (default 2; e.g. 2,4)")
    p.add_argument("--tensors", type=int, default=200, help="tensors per step (default 200)")
    p.add_argument("--tensor-kb", type=int, default=16, help="KiB per tensor, float32 (default 16)")
    p.add_argument(
        "--steps", type=int, default=90, help="timed steps per variant, split over the rounds (default 90)"
    )
    p.add_argument(
        "--warmup", type=int, default=5, help="untimed steps per variant at the start of every launch (5)"
    )
    p.add_argument("--rounds", type=int, default=3, help="times every launch runs, alternating (default 3)")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="variants in run order, from %(default)s (default: all)",
    )
    p.add_argument(
        "--hora-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine setting for every hora launch (repeatable; e.g. HORA_CYCLE_TIME=1); "
        "hora-unfused still gets HORA_FUSION_THRESHOLD=0",
    )
    p.add_argument(
        "--out-of-place",
        action="store_true",
        help="hora submits with allreduce_async (new output arrays) instead of allreduce_async_",
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds one launch may take (default 600)")
    p.add_argument(
        "--mpirun-args",
        default="--oversubscribe --bind-to none",
        help="extra mpirun options (default: %(default)r, like the unbound hora and gloo ranks)",
    )
    p.add_argument("--json", metavar="PATH", help="also write every step time and the summary as JSON")
    p.add_argument("--autotune", action="store_true", help="also run hora with HORA_AUTOTUNE=1 (hora-autotune)")
    p.add_argument(
        "--grid", action="store_true", help="grid search of the engine settings against hora-autotune (see above)"
    )
    p.add_argument("--grid-fusion-mb", default="0,1,8,64", help="fusion thresholds of the grid, MiB (%(default)s)")
    p.add_argument("--grid-cycle-ms", default="0.5,2,10", help="cycle times of the grid, ms (%(default)s)")
    p.add_argument("--grid-cache", default="1,0", help="cache on (1) / off (0) in the grid (%(default)s)")
    p.add_argument("--worker", choices=["hora", "gloo", "mpi"], help=argparse.SUPPRESS)
    p.add_argument("--tune-log", default="", help=argparse.SUPPRESS)
    p.add_argument("--group", default="", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tensors < 1 or args.tensor_kb < 1 or args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--tensors, --tensor-kb, --steps and --rounds must be at least 1, --warmup at least 0")
    if args.worker:
        return worker(args)
    try:
        args.np = parse_counts(args.np)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.grid:
        try:
            args.variants = grid_variants(args.grid_fusion_mb, args.grid_cycle_ms, args.grid_cache)
        except ValueError as exc:
            p.error(f"--grid-*: {exc}")
    if args.grid or args.autotune:
        VARIANTS["hora-autotune"] = AUTOTUNE
        args.variants.append("hora-autotune")
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        p.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    env: dict[str, str] = {}
    for item in args.hora_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--hora-env takes KEY=VALUE, got {item!r}")
        env[key] = value
    args.hora_env = env
    if args.steps < args.rounds:
        p.error(f"--steps ({args.steps}) must be at least --rounds ({args.rounds})")
    # autotune's logs, which the workers read to learn the point kept: removed at the end
    args.tune_dir = tempfile.mkdtemp(prefix="hora-bench-autotune-") if args.grid or args.autotune else ""
    try:
        return driver(args)
    finally:
        if args.tune_dir:
            shutil.rmtree(args.tune_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
