"""Training benchmark: hora.torch.DistributedOptimizer vs torch DistributedDataParallel (gloo), interleaved.

Both frameworks train the same model from the same seeds: an MLP 1024 -> 4096 -> 4096 -> 1024 -> 10 (25,185,290
float32 parameters, 101 MB of gradients per step), SGD with momentum, cross-entropy on random data, ``--batch-size``
(default 32) samples per rank and step. Frameworks:

    hora    ``hvd.DistributedOptimizer(opt, named_parameters=...)`` after ``broadcast_parameters`` and
            ``broadcast_optimizer_state``: Horovod's recipe, under ``hora run`` (shared memory)
    ddp     ``torch.nn.parallel.DistributedDataParallel`` (default buckets) on ``init_process_group("gloo")``,
            under the same ``hora run`` launcher, which exports RANK, WORLD_SIZE and MASTER_ADDR/PORT

Driver (default)::

    python benchmarks/torch_training.py                  # N = 2, both frameworks, 3 rounds
    python benchmarks/torch_training.py --np 2,4 --json /tmp/torch_training.json
    python benchmarks/torch_training.py --smoke          # 2 rounds x 2 steps: checks that it runs, in seconds
    python benchmarks/torch_training.py --model many     # 200 parameters of 16 KiB (200 x Linear(64, 64))
    python benchmarks/torch_training.py --load 1         # beside one foreign busy process
    python benchmarks/torch_training.py --previous /tmp/prev/src   # + hora-prev: an earlier commit's hora

Autotune (issue 14): ``--autotune`` starts hora with HORA_AUTOTUNE=1; every hora launch then trains untimed until
rank 0's autotune log holds the point autotune kept, and is timed from there. ``--hora-env KEY=VALUE`` sets an
engine setting for the hora launches, so a grid search is a loop over launches (docs/autotune.md)::

    python benchmarks/torch_training.py --frameworks hora --autotune --json /tmp/torch-autotune.json
    python benchmarks/torch_training.py --frameworks hora --hora-env HORA_FUSION_THRESHOLD=8388608 \
        --hora-env HORA_CYCLE_TIME=2 --json /tmp/torch-f8-c2.json

Method. Every launch runs one framework on N ranks. Inside it, three kinds of step alternate, step by step (the
first kind rotates every step), so machine noise hits all alike:

    distributed   zero_grad, forward, backward, optimizer step through the framework: the real training step
    compute-only  the same on a second, plain copy of the model with a plain optimizer -- identical arithmetic,
                  no communication, no framework hooks -- on the same batch, in the same processes
    one allreduce the compute-only step on a third copy plus, after its backward pass, one allreduce (the
                  framework's own: ``hvd.allreduce_``, ``dist.all_reduce``) of a buffer as large as all the
                  gradients: the yardstick of issue 28's target (the communication a step adds should cost at most
                  1.5x what one allreduce of its bytes adds)

Every timed step starts after a barrier (not timed) and is timed on every rank; the slowest rank's time per step
is kept. Samples/s total = N x batch / median distributed step; per worker = batch / median step. The comm share
is the part of the step that communication adds: 1 - median compute-only step / median distributed step, i.e.
the exposed communication (and framework overhead); communication that overlaps the backward pass costs nothing.
"adds" = median distributed step - median compute-only step; "one allreduce adds" = median one-allreduce step -
median compute-only step; their ratio is issue 28's target (at most 1.5).
Because all kinds run concurrently on all ranks, the compute-only step sees the same core sharing as the real
one. After the timed steps the ranks compare a checksum of their parameters: replicas that differ are reported as
WRONG. Launches alternate between the frameworks round-robin for ``--rounds`` rounds (the first framework rotates
each round), each with ``--warmup`` untimed steps of each kind and ``steps/rounds`` timed ones.

Worker (``--worker hora|ddp``): runs inside every rank and prints ``HORA_BENCH {json}`` lines from rank 0.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from _common import busy_processes, emit, finish, hora_command, machine, parse_counts, run_ranks, torch_missing

FRAMEWORKS = {
    "hora": "hora DistributedOptimizer",
    "ddp": "torch DDP (gloo)",
    "hora-prev": "hora DistributedOptimizer, --previous",  # an earlier hora's src, in the same run
}
BASELINE = "ddp"
TARGET = 1.5  # hora should train at least this many times DDP's samples/s (issue 14)
ADDS_TARGET = 1.5  # what a step's communication adds, at most this many times what one allreduce of its bytes adds
LAYERS = (1024, 4096, 4096, 1024, 10)
CLASSES = LAYERS[-1]
#: --model many: MANY layers Linear(WIDTH, WIDTH, bias=False) with tanh between, 16 KiB of weights each (issue 28's
#: model of many small parameters, as real networks have: ResNet-50 161 tensors, BERT-base about 200). Orthogonal
#: weights of gain MANY_GAIN keep the signal alive through the 200 tanh layers (PyTorch's default init shrinks the
#: activations to exactly 0 by the last layers, so every gradient was 0 and the arithmetic ran on denormals).
MANY, WIDTH, MANY_GAIN = 200, 64, 1.1
LR, MOMENTUM = 0.01, 0.9


# -- workers -------------------------------------------------------------------------------------------------------
def make_model(kind: str = "mlp") -> Any:
    from torch import nn

    layers: list[nn.Module] = []
    if kind == "many":
        for i in range(MANY):
            layers.append(nn.Linear(WIDTH, WIDTH, bias=False))
            nn.init.orthogonal_(layers[-1].weight, gain=MANY_GAIN)
            if i < MANY - 1:
                layers.append(nn.Tanh())
        return nn.Sequential(*layers)
    for i, (n_in, n_out) in enumerate(itertools.pairwise(LAYERS)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(LAYERS) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def parameter_count(kind: str = "mlp") -> int:
    if kind == "many":
        return MANY * WIDTH * WIDTH
    return sum(n_in * n_out + n_out for n_in, n_out in itertools.pairwise(LAYERS))


def model_name(kind: str) -> str:
    if kind == "many":
        return f"{MANY} x Linear({WIDTH}, {WIDTH}) ({MANY} parameters of {WIDTH * WIDTH * 4 // 1024} KiB)"
    return f"MLP {' -> '.join(map(str, LAYERS))}"


class Framework:
    """How one framework makes a model data-parallel, plus the untimed collectives the measurement needs."""

    rank = 0
    size = 1
    local_size = 1

    def wrap(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def allreduce_flat(self, buffer: Any) -> None:
        """One allreduce of ``buffer`` in place, the framework's own (the "one allreduce" step kind)."""
        raise NotImplementedError

    def max_all(self, values: Any, name: str) -> Any:
        """Element-wise maximum of a float64 tensor across ranks (not timed)."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class HoraFramework(Framework):
    def __init__(self, views: bool = False) -> None:
        import hora
        import hora.torch as hvd

        self.hvd, self.version, self.views = hvd, hora.__version__, views
        hvd.init()
        self.rank, self.size, self.local_size = hvd.rank(), hvd.size(), hvd.local_size()

    def wrap(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        kwargs = {"gradient_as_bucket_view": True} if self.views else {}
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **kwargs)
        return model, optimizer

    def barrier(self) -> None:
        self.hvd.barrier()

    def allreduce_flat(self, buffer: Any) -> None:
        self.hvd.allreduce_(buffer, name="bench.flat")

    def max_all(self, values: Any, name: str) -> Any:
        return self.hvd.allreduce(values, op=self.hvd.Max, name=name)

    def info(self) -> dict[str, Any]:
        import torch

        return {"version": f"hora {self.version}, torch {torch.__version__}"}

    def close(self) -> None:
        self.hvd.shutdown()


class DdpFramework(Framework):
    def __init__(self) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.size))

    def wrap(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        # DDP broadcasts rank 0's parameters when it wraps the model; the optimizer holds the same tensors.
        return self.torch.nn.parallel.DistributedDataParallel(model), optimizer

    def barrier(self) -> None:
        self.dist.barrier()

    def allreduce_flat(self, buffer: Any) -> None:
        self.dist.all_reduce(buffer)

    def max_all(self, values: Any, name: str) -> Any:
        out = values.clone()
        self.dist.all_reduce(out, op=self.dist.ReduceOp.MAX)
        return out

    def info(self) -> dict[str, Any]:
        return {"version": f"torch {self.torch.__version__} (gloo)"}

    def close(self) -> None:
        self.dist.destroy_process_group()


def tune(fw: Framework, step: Any, log: str, limit: int = 5000) -> dict[str, Any]:
    """Step until autotune has written the point it kept (the log's last row, after one row per scored sample);
    rank 0 reads the log, every rank learns from an allreduce after each step. Returns what the log says."""
    import torch

    from hora.config import Config

    rows = Config.resolve().autotune_bayes_opt_max_samples + 1
    steps, lines = 0, []
    while steps < limit:
        step()
        steps += 1
        if fw.rank == 0 and os.path.exists(log):
            with open(log) as f:
                lines = f.read().splitlines()
        done = torch.tensor([1.0 if len(lines) > rows else 0.0], dtype=torch.float64)
        if fw.max_all(done, "bench.tuned")[0] > 0:
            break
    return {"steps": steps, "chosen": lines[-1] if len(lines) > rows else None, "log": lines}


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    fw: Framework = HoraFramework(args.gradient_as_bucket_view) if args.worker.startswith("hora") else DdpFramework()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()  # by default what a user gets: the launcher's OMP_NUM_THREADS, if any
    torch.manual_seed(args.seed)
    model, local, reference = make_model(args.model), make_model(args.model), make_model(args.model)
    width, classes = (WIDTH, WIDTH) if args.model == "many" else (LAYERS[0], CLASSES)
    local.load_state_dict(model.state_dict())
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    local_optimizer = torch.optim.SGD(local.parameters(), lr=LR, momentum=MOMENTUM)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    model, optimizer = fw.wrap(model, optimizer)
    gen = torch.Generator().manual_seed(args.seed + 1 + fw.rank)  # every rank its own batch, as with sharding
    x = torch.randn(args.batch_size, width, generator=gen)
    y = torch.randint(0, classes, (args.batch_size,), generator=gen)
    n_params = sum(p.numel() for p in local.parameters())
    emit(
        fw.rank,
        {
            "kind": "start",
            "framework": args.worker,
            "np": fw.size,
            "threads": threads,
            "params": n_params,
            **fw.info(),
        },
    )

    kinds = {
        "distributed": (model, optimizer),
        "compute": (local, local_optimizer),
        "reference": (reference, reference_optimizer),
    }
    flat = torch.zeros(n_params)  # the "one allreduce" kind's buffer: as many bytes as the gradients

    def step(kind: str) -> None:
        m, opt = kinds[kind]
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        if kind == "reference":
            fw.allreduce_flat(flat)
        opt.step()

    order = list(kinds)
    if args.tune_log:  # autotune first: untimed steps until rank 0's log holds the point it kept
        emit(fw.rank, {"kind": "tuned", **tune(fw, lambda: step("distributed"), args.tune_log)})
    for _ in range(args.warmup):
        for kind in order:
            fw.barrier()
            step(kind)
    clock = time.perf_counter
    times = {kind: torch.zeros(args.steps, dtype=torch.float64) for kind in kinds}
    for i in range(args.steps):
        for kind in order[i % len(order) :] + order[: i % len(order)]:
            fw.barrier()
            t0 = clock()
            step(kind)
            times[kind][i] = clock() - t0
    # Per step, the slowest rank's time.
    slowest = {kind: fw.max_all(t, f"bench.{kind}_s") for kind, t in times.items()}
    with torch.no_grad():
        checksum = torch.stack([p.detach().double().sum() for p in model.parameters()])
    same = bool(torch.equal(fw.max_all(checksum, "bench.max_sum"), -fw.max_all(-checksum, "bench.min_sum")))
    emit(
        fw.rank,
        {
            "kind": "result",
            "framework": args.worker,
            "np": fw.size,
            "round": args.round,
            "ok": same,
            "step_s": slowest["distributed"].tolist(),
            "compute_s": slowest["compute"].tolist(),
            "reference_s": slowest["reference"].tolist(),
        },
    )
    fw.barrier()
    emit(fw.rank, {"kind": "done", "framework": args.worker})
    fw.close()
    return 0


# -- driver --------------------------------------------------------------------------------------------------------
def launch(args: argparse.Namespace, framework: str, n: int, steps: int, round_: int) -> list[str] | str:
    """The command of one launch, or why it is skipped."""
    missing = torch_missing()
    if missing:
        return missing
    worker_args = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        framework,
        "--steps",
        str(steps),
        "--warmup",
        str(args.warmup),
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--round",
        str(round_),
        "--model",
        args.model,
    ]
    if framework == "hora" and args.gradient_as_bucket_view:  # hora-prev may predate the argument
        worker_args.append("--gradient-as-bucket-view")
    if framework.startswith("hora") and args.autotune:
        worker_args += ["--tune-log", os.path.join(args.tune_dir, f"autotune-np{n}-round{round_}.csv")]
    return hora_command(n) + worker_args


def launch_env(args: argparse.Namespace, framework: str, cmd: list[str]) -> dict[str, str]:
    """The environment of one launch: --hora-env and autotune's settings for hora."""
    env = dict(os.environ)
    if framework == "hora-prev":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.previous, env.get("PYTHONPATH", "")]))
    if framework.startswith("hora"):
        env.update(args.hora_env)
        if "--tune-log" in cmd:
            env.update({"HORA_AUTOTUNE": "1", "HORA_AUTOTUNE_LOG": cmd[cmd.index("--tune-log") + 1]})
    return env


def summarize(recs: list[dict[str, Any]], batch: int, n: int) -> dict[str, Any]:
    step = np.asarray([t for r in recs for t in r["step_s"]])
    compute = np.asarray([t for r in recs for t in r["compute_s"]])
    reference = np.asarray([t for r in recs for t in r.get("reference_s", [])])
    median = float(np.median(step))
    # What communication adds, as the median of each iteration's difference (the kinds run back to back in every
    # iteration): the machine's speed drifts between launches and within one (the two-core box runs a rank's
    # arithmetic up to 1.5x slower at times), and the difference of two medians takes that drift in.
    adds = float(np.median(step - compute))
    one = float(np.median(reference - compute)) if len(reference) else None
    return {
        "ok": all(r["ok"] for r in recs),
        "steps": len(step),
        "median_s": median,
        "p90_s": float(np.percentile(step, 90)),
        "compute_median_s": float(np.median(compute)),
        "adds_s": adds,
        "one_allreduce_adds_s": one,
        "comm_share": max(0.0, 1.0 - float(np.median(compute)) / median),
        "samples_per_s": n * batch / median,
        "samples_per_s_per_worker": batch / median,
        "round_medians_s": [float(np.median(r["step_s"])) for r in recs],
    }


def table(args: argparse.Namespace, n: int, summary: dict[str, dict[str, Any]]) -> str:
    base = summary.get(BASELINE)
    lines = [
        f"### N = {n}: batch {args.batch_size} per rank, {parameter_count(args.model):,} parameters",
        "",
        "| framework | samples/s total | per worker | median ms/step | p90 ms/step | compute-only ms/step "
        "| comm share | adds ms | one allreduce adds ms | adds ÷ one allreduce | x DDP | steps | round medians (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in args.frameworks:
        s, label = summary.get(key), FRAMEWORKS[key]
        if s is None:
            lines.append(f"| {label} | — | — | — | — | — | — | — | — | — | — | 0 | — |")
            continue
        if not s["ok"]:
            lines.append(f"| {label} | WRONG (replicas differ) | | | | | | | | | | {s['steps']} | |")
            continue
        one = s["one_allreduce_adds_s"]
        yardstick = "— | —" if one is None else f"{one * 1e3:.3g} | " + (
            f"{s['adds_s'] / one:.2f}" if one > 0 else "—")  # within the noise: no ratio
        ratio = f"{s['samples_per_s'] / base['samples_per_s']:.2f}x" if base and base["ok"] else "—"
        rounds = " / ".join(f"{x * 1e3:.4g}" for x in s["round_medians_s"])
        lines.append(
            f"| {label} | {s['samples_per_s']:.1f} | {s['samples_per_s_per_worker']:.1f} | "
            f"{s['median_s'] * 1e3:.4g} | {s['p90_s'] * 1e3:.4g} | {s['compute_median_s'] * 1e3:.4g} | "
            f"{s['comm_share'] * 100:.0f} % | {s['adds_s'] * 1e3:.3g} | {yardstick} | {ratio} | {s['steps']} | "
            f"{rounds} |"
        )
    lines.append("")
    hora = summary.get("hora")
    if hora and base and hora["ok"] and base["ok"]:
        r = hora["samples_per_s"] / base["samples_per_s"]
        verdict = "met" if r >= TARGET else "NOT met"
        lines += [f"Target: hora ≥ {TARGET}x DDP samples/s: {r:.3f}x — {verdict}.", ""]
        one = hora["one_allreduce_adds_s"]
        if one and one > 0:
            q = hora["adds_s"] / one
            lines += [f"Target (issue 28): the step's communication ≤ {ADDS_TARGET}x one allreduce of its bytes: "
                      f"{q:.2f}x — {'met' if q <= ADDS_TARGET else 'NOT met'}.", ""]
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    started = time.time()
    steps = math.ceil(args.steps / args.rounds)
    print(
        f"# Training benchmark: {model_name(args.model)} ({parameter_count(args.model):,} parameters), "
        f"batch {args.batch_size} per rank; N = {', '.join(map(str, args.np))}; {args.rounds} rounds x {steps} "
        f"timed steps of each kind per framework after {args.warmup} warm-up steps"
        + (f"; beside {args.load} busy foreign process(es)" if args.load else "; quiet")
        + "\n",
        flush=True,
    )
    m = machine()
    print(f"Machine: {m['node']}, {m['cpus']} CPUs, Python {m['python']}, numpy {m['numpy']}.\n", flush=True)
    raw: list[dict[str, Any]] = []
    tuned: list[dict[str, Any]] = []  # what autotune kept, per hora launch
    starts: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    failed = 0
    fws = args.frameworks
    for n in args.np:
        for r in range(args.rounds):
            for fw in fws[r % len(fws) :] + fws[: r % len(fws)]:
                print(
                    f"[{time.time() - started:6.0f}s] N={n} round {r + 1}/{args.rounds}: {fw}",
                    file=sys.stderr,
                    flush=True,
                )
                cmd = launch(args, fw, n, steps, r)
                if isinstance(cmd, str):
                    if r == 0:
                        notes.append(f"{fw} at N={n}: skipped: {cmd}")
                        print(f"  skipped: {cmd}", file=sys.stderr, flush=True)
                    continue

                def progress(rec: dict[str, Any]) -> None:
                    if rec["kind"] == "result":
                        flag = "" if rec["ok"] else "  WRONG: replicas differ"
                        print(
                            f"  {rec['framework']:>5}: median {np.median(rec['step_s']) * 1e3:8.2f} ms/step, "
                            f"compute-only {np.median(rec['compute_s']) * 1e3:8.2f} ms, one allreduce "
                            f"{np.median(rec['reference_s']) * 1e3:8.2f} ms{flag}",
                            file=sys.stderr,
                            flush=True,
                        )

                env = launch_env(args, fw, cmd)
                records, note = run_ranks(cmd, env, timeout=args.timeout, on_record=progress)
                for rec in records:
                    if rec["kind"] == "start":
                        starts[fw] = rec
                    elif rec["kind"] == "tuned":
                        tuned.append({"np": n, "round": r, **rec})
                        print(f"  autotune kept {rec['chosen']} after {rec['steps']} steps", file=sys.stderr)
                    elif rec["kind"] == "result":
                        raw.append(rec)
                if note:
                    failed += 1
                    notes.append(f"{fw} at N={n}, round {r + 1}: {note}")
                    print(f"  failed: {note}", file=sys.stderr, flush=True)
    elapsed = time.time() - started

    summaries: dict[int, dict[str, dict[str, Any]]] = {}
    for n in args.np:
        for fw in fws:
            recs = [x for x in raw if x["np"] == n and x["framework"] == fw]
            if recs:
                summaries.setdefault(n, {})[fw] = summarize(recs, args.batch_size, n)
    if starts:
        print("Versions: " + "; ".join(f"{fw}: {s.get('version', '')}" for fw, s in starts.items()))
        threads = sorted({s["threads"] for s in starts.values()})
        print(f"torch threads per rank: {', '.join(map(str, threads))}\n")
    print(
        "Cells: step = the slowest rank's time for zero_grad + forward + backward + optimizer step, median and "
        "90th percentile over all rounds' steps. compute-only = the same step on a plain copy of the model "
        "(no communication). comm share = 1 - compute-only / step. adds = the median over iterations of step - "
        "compute-only (the kinds run back to back in each iteration); one allreduce adds = the same for a step of "
        "compute-only + one allreduce of all the gradients' bytes. x DDP = samples/s over DDP's.\n"
    )
    for n in args.np:
        print(table(args, n, summaries.get(n, {})))
    if args.hora_env:
        print(f"hora engine settings: {args.hora_env}\n")
    if args.gradient_as_bucket_view:
        print("hora: DistributedOptimizer(gradient_as_bucket_view=True)\n")
    for t in tuned:
        print(f"Autotune at N={t['np']}, round {t['round'] + 1}: kept {t['chosen']} after {t['steps']} steps.")
    wrong = [f"{fw} at N={n}" for n, s in summaries.items() for fw, v in s.items() if not v["ok"]]
    notes += [f"{w}: the replicas' parameters differ after training" for w in wrong]
    finish(notes, elapsed, args.json, {
        "machine": m,
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "round", "tune_log")},
        "starts": starts,
        "summary": {str(n): s for n, s in summaries.items()},
        "results": raw,
        "autotune": tuned,
    })  # fmt: skip
    return 1 if wrong or failed or not raw else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2", help="rank counts, comma-separated (default 2; e.g. 2,4)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step (default 32)")
    p.add_argument(
        "--steps",
        type=int,
        default=60,
        help="timed steps of each kind per framework, split over the rounds (60)",
    )
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed steps of each kind at the start of a launch (3)"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="times every framework runs, alternating (default 3)"
    )
    p.add_argument(
        "--frameworks", default="hora,ddp",
        help="frameworks in run order (default: %(default)s; --previous adds hora-prev)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the random data (default 0)")
    p.add_argument(
        "--model", choices=("mlp", "many"), default="mlp",
        help=f"mlp (the default: few large tensors) or many ({MANY} parameters of 16 KiB)",
    )  # fmt: skip
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per rank (default 0: leave torch's default, i.e. what hora run's thread defaults give)",
    )
    p.add_argument(
        "--smoke", action="store_true", help="2 rounds x 2 timed steps, 1 warm-up: checks that it runs"
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds one launch may take (default 600)")
    p.add_argument("--json", metavar="PATH", help="also write every step time and the summary as JSON")
    p.add_argument(
        "--autotune", action="store_true", help="hora with HORA_AUTOTUNE=1, timed after autotune kept a point"
    )
    p.add_argument(
        "--hora-env", action="append", default=[], metavar="KEY=VALUE",
        help="an engine setting for every hora launch (repeatable; e.g. HORA_CYCLE_TIME=2)",
    )  # fmt: skip
    p.add_argument(
        "--previous", metavar="SRC",
        help="also run the hora-prev framework: hora imported from SRC (e.g. the src/ of a git worktree of an "
        "earlier commit), interleaved with the others in the same run",
    )  # fmt: skip
    p.add_argument(
        "--load", type=int, default=0, metavar="K",
        help="run every launch beside K foreign busy processes (python -c 'while True: pass'); default 0: quiet",
    )  # fmt: skip
    p.add_argument(
        "--gradient-as-bucket-view", action="store_true",
        help="hora (not hora-prev) with DistributedOptimizer(gradient_as_bucket_view=True)",
    )
    p.add_argument("--worker", choices=sorted(FRAMEWORKS), help=argparse.SUPPRESS)
    p.add_argument("--tune-log", default="", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.warmup, args.rounds = 4, 1, 2
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 0 or args.rounds < 1 or args.threads < 0:
        p.error("--batch-size, --steps and --rounds must be at least 1, --warmup and --threads at least 0")
    if args.worker:
        return worker(args)
    env: dict[str, str] = {}
    for item in args.hora_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--hora-env takes KEY=VALUE, got {item!r}")
        env[key] = value
    args.hora_env = env
    try:
        args.np = parse_counts(args.np)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if args.previous:
        args.previous = os.path.abspath(args.previous)
        if not os.path.isdir(os.path.join(args.previous, "hora")):
            p.error(f"--previous {args.previous}: no hora package there (give the src/ directory of a checkout)")
        if "hora-prev" not in args.frameworks:
            args.frameworks.append("hora-prev")
    elif "hora-prev" in args.frameworks:
        p.error("the hora-prev framework needs --previous SRC")
    bad = [f for f in args.frameworks if f not in FRAMEWORKS]
    if bad or not args.frameworks:
        p.error(f"unknown framework(s) {bad}; choose from {', '.join(FRAMEWORKS)}")
    if args.steps < args.rounds:
        p.error(f"--steps ({args.steps}) must be at least --rounds ({args.rounds})")
    # autotune's logs, which the workers read to learn the point kept: removed at the end
    args.tune_dir = tempfile.mkdtemp(prefix="hora-bench-autotune-") if args.autotune else ""
    try:
        with busy_processes(args.load):
            return driver(args)
    finally:
        if args.tune_dir:
            shutil.rmtree(args.tune_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
