"""Training benchmark: hora.jax.DistributedOptimizer vs JAX's own multi-process collectives (gloo), interleaved.

Both train the same jitted MLP step from the same seeds: an MLP ``--layers`` (default 1024 -> 2048 -> 2048 -> 10,
6,316,042 float32 parameters, 25 MB of gradients per step), optax SGD with momentum, softmax cross-entropy on random
data, ``--batch-size`` (default 64) samples per rank and step. Frameworks:

    hora    ``jax.jit(step)`` where step = value_and_grad + ``hvd.DistributedOptimizer(optax.sgd(...))``: the
            gradient pytree is averaged in one hora callback per step (shared memory), under ``hora run``
    jax     ``jax.distributed.initialize`` (CPU collectives: gloo), one CPU device per process, a global mesh;
            params replicated, the global batch sharded over the processes
            (``jax.make_array_from_process_local_data``); XLA inserts the gradient all-reduce itself. Under the
            same ``hora run`` launcher, whose MASTER_ADDR/MASTER_PORT are the coordinator's address

Driver (default)::

    python benchmarks/jax_training.py                   # N = 2 and 4, both frameworks, 3 rounds
    python benchmarks/jax_training.py --np 2 --json /tmp/jax_training.json
    python benchmarks/jax_training.py --smoke           # tiny model, 2 rounds x 2 steps: checks that it runs

Method. Every launch runs one framework on N ranks; launches alternate between the frameworks round-robin for
``--rounds`` rounds (the first framework rotates each round), N = 2 and 4 in turn. In a launch, ``--warmup``
untimed steps (compilation included), then timed steps: every timed step starts after a barrier (not timed) and
ends when its parameters are ready (``block_until_ready``); the slowest rank's time per step is kept. Samples/s
total = N x batch / median step. After the timed steps the ranks compare a checksum of their parameters: replicas
that differ are reported as WRONG. Target (issue 17): hora ≥ JAX's own samples/s.

Worker (``--worker hora|jax``): runs inside every rank and prints ``HORA_BENCH {json}`` lines from rank 0.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from typing import Any

import numpy as np
from _common import emit, finish, hora_command, machine, parse_counts, run_ranks

FRAMEWORKS = {"hora": "hora.jax DistributedOptimizer", "jax": "jax.distributed (gloo)"}
BASELINE = "jax"
TARGET = 1.0
LR, MOMENTUM = 0.01, 0.9


def parameter_count(layers: list[int]) -> int:
    return sum(a * b + b for a, b in itertools.pairwise(layers))


# -- workers -------------------------------------------------------------------------------------------------------
class Framework:
    rank = 0
    size = 1

    def barrier(self) -> None:
        raise NotImplementedError

    def max_all(self, values: np.ndarray) -> np.ndarray:
        """Element-wise maximum of a float64 array across ranks (not timed)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class HoraFramework(Framework):
    def __init__(self) -> None:
        import hora.jax as hvd

        self.hvd = hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()

    def make_step(self, loss_fn: Any, optimizer: Any) -> tuple[Any, Any]:
        import jax
        import optax

        dist = self.hvd.DistributedOptimizer(optimizer)

        @jax.jit
        def step(params: Any, state: Any, x: Any, y: Any) -> Any:
            grads = jax.grad(loss_fn)(params, x, y)
            updates, state = dist.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        def prepare(params: Any) -> Any:
            return self.hvd.broadcast_parameters(params, root_rank=0)

        return step, (dist, prepare)

    def barrier(self) -> None:
        self.hvd.barrier()

    def max_all(self, values: np.ndarray) -> np.ndarray:
        import hora.numpy as hnp

        return hnp.allreduce(values, op=hnp.Max)

    def close(self) -> None:
        self.hvd.shutdown()


class JaxFramework(Framework):
    def __init__(self) -> None:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        addr = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        jax.distributed.initialize(addr, int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]))
        self.jax = jax
        self.rank, self.size = jax.process_index(), jax.process_count()
        self.mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))

    def sharding(self, spec: Any) -> Any:
        return self.jax.sharding.NamedSharding(self.mesh, spec)

    def make_step(self, loss_fn: Any, optimizer: Any) -> tuple[Any, Any]:
        import jax
        import optax
        from jax.sharding import PartitionSpec as P

        replicated, batch = self.sharding(P()), self.sharding(P("data"))

        @jax.jit
        def step(params: Any, state: Any, x: Any, y: Any) -> Any:
            grads = jax.grad(loss_fn)(params, x, y)  # the loss is the global batch's mean: XLA all-reduces
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        def prepare(params: Any) -> Any:  # every rank made the same weights (same seed): replicate them
            return jax.tree_util.tree_map(
                lambda a: jax.make_array_from_process_local_data(replicated, np.asarray(a)), params
            )

        def shard(a: np.ndarray) -> Any:
            return jax.make_array_from_process_local_data(batch, a)

        return step, (optimizer, prepare, shard)

    def barrier(self) -> None:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("bench")

    def max_all(self, values: np.ndarray) -> np.ndarray:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(values)).max(axis=0)

    def close(self) -> None:
        self.jax.distributed.shutdown()


def worker(args: argparse.Namespace) -> int:
    fw: Framework = HoraFramework() if args.worker == "hora" else JaxFramework()
    import jax
    import jax.numpy as jnp
    import optax

    layers = [int(x) for x in args.layers.split(",")]

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        h = x
        for i in range(len(layers) - 1):
            h = h @ params[f"w{i}"] + params[f"b{i}"]
            if i < len(layers) - 2:
                h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

    keys = jax.random.split(jax.random.PRNGKey(args.seed), len(layers) - 1)
    params = {}
    for i, (a, b) in enumerate(itertools.pairwise(layers)):
        params[f"w{i}"] = jax.random.normal(keys[i], (a, b), jnp.float32) * (2.0 / a) ** 0.5
        params[f"b{i}"] = jnp.zeros(b, jnp.float32)
    optimizer = optax.sgd(LR, momentum=MOMENTUM)
    step, extra = fw.make_step(loss_fn, optimizer)
    rng = np.random.default_rng(args.seed + 1 + fw.rank)  # every rank its own batch, as with sharding
    x = rng.standard_normal((args.batch_size, layers[0]), np.float32)
    y = rng.integers(0, layers[-1], args.batch_size).astype(np.int32)
    if args.worker == "hora":
        dist, prepare = extra
        params = prepare(params)
        state = dist.init(params)
        xs, ys = jnp.asarray(x), jnp.asarray(y)
    else:
        opt, prepare, shard = extra
        params = prepare(params)
        state = opt.init(params)
        xs, ys = shard(x), shard(y)
    emit(fw.rank, {"kind": "start", "framework": args.worker, "np": fw.size, "params": parameter_count(layers),
                   "version": f"jax {jax.__version__}, optax {optax.__version__}"})  # fmt: skip
    for _ in range(args.warmup):
        fw.barrier()
        params, state = step(params, state, xs, ys)
        jax.block_until_ready(params)
    times = np.zeros(args.steps, np.float64)
    for i in range(args.steps):
        fw.barrier()
        t0 = time.perf_counter()
        params, state = step(params, state, xs, ys)
        jax.block_until_ready(params)
        times[i] = time.perf_counter() - t0
    slowest = fw.max_all(times)
    local = np.asarray([float(np.asarray(jax.device_get(p.addressable_shards[0].data), np.float64).sum())
                        for p in jax.tree_util.tree_leaves(params)])  # fmt: skip
    same = bool(np.array_equal(fw.max_all(local), -fw.max_all(-local)))
    emit(fw.rank, {"kind": "result", "framework": args.worker, "np": fw.size, "round": args.round, "ok": same,
                   "step_s": slowest.tolist()})  # fmt: skip
    fw.barrier()
    emit(fw.rank, {"kind": "done", "framework": args.worker})
    fw.close()
    return 0


# -- driver --------------------------------------------------------------------------------------------------------
def summarize(recs: list[dict[str, Any]], batch: int, n: int) -> dict[str, Any]:
    step = np.asarray([t for r in recs for t in r["step_s"]])
    median = float(np.median(step))
    return {
        "ok": all(r["ok"] for r in recs), "steps": len(step), "median_s": median,
        "p90_s": float(np.percentile(step, 90)), "samples_per_s": n * batch / median,
        "round_medians_s": [float(np.median(r["step_s"])) for r in recs],
    }  # fmt: skip


def table(args: argparse.Namespace, n: int, summary: dict[str, dict[str, Any]]) -> str:
    base = summary.get(BASELINE)
    lines = [
        f"### N = {n}: batch {args.batch_size} per rank, {parameter_count(args.layer_list):,} parameters", "",
        "| framework | samples/s total | median ms/step | p90 ms/step | x JAX | steps | round medians (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for key in args.frameworks:
        s, label = summary.get(key), FRAMEWORKS[key]
        if s is None:
            lines.append(f"| {label} | — | — | — | — | 0 | — |")
        elif not s["ok"]:
            lines.append(f"| {label} | WRONG (replicas differ) | | | | {s['steps']} | |")
        else:
            ratio = f"{s['samples_per_s'] / base['samples_per_s']:.2f}x" if base and base["ok"] else "—"
            rounds = " / ".join(f"{x * 1e3:.4g}" for x in s["round_medians_s"])
            lines.append(f"| {label} | {s['samples_per_s']:.1f} | {s['median_s'] * 1e3:.4g} | "
                         f"{s['p90_s'] * 1e3:.4g} | {ratio} | {s['steps']} | {rounds} |")  # fmt: skip
    hora = summary.get("hora")
    if hora and base and hora["ok"] and base["ok"]:
        r = hora["samples_per_s"] / base["samples_per_s"]
        lines += ["", f"Target: hora ≥ {TARGET}x JAX's samples/s: {r:.3f}x — {'met' if r >= TARGET else 'NOT met'}."]
    return "\n".join([*lines, ""])


def driver(args: argparse.Namespace) -> int:
    started = time.time()
    steps = math.ceil(args.steps / args.rounds)
    layers = " -> ".join(map(str, args.layer_list))
    print(f"# JAX training benchmark: MLP {layers} ({parameter_count(args.layer_list):,} parameters), batch "
          f"{args.batch_size} per rank; N = {', '.join(map(str, args.np))}; {args.rounds} rounds x {steps} timed "
          f"steps per framework after {args.warmup} warm-up steps\n", flush=True)  # fmt: skip
    m = machine()
    print(f"Machine: {m['node']}, {m['cpus']} CPUs, Python {m['python']}, numpy {m['numpy']}.\n", flush=True)
    raw: list[dict[str, Any]] = []
    starts: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    failed = 0
    fws = args.frameworks
    for r in range(args.rounds):  # interleaved: every round runs every N and every framework
        for n in args.np:
            for fw in fws[r % len(fws) :] + fws[: r % len(fws)]:
                print(f"[{time.time() - started:6.0f}s] N={n} round {r + 1}/{args.rounds}: {fw}", file=sys.stderr,
                      flush=True)  # fmt: skip
                cmd = [*hora_command(n), sys.executable, os.path.abspath(__file__), "--worker", fw, "--steps",
                       str(steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), "--seed",
                       str(args.seed), "--layers", args.layers, "--round", str(r)]  # fmt: skip
                records, note = run_ranks(cmd, dict(os.environ), timeout=args.timeout)
                for rec in records:
                    if rec["kind"] == "start":
                        starts[fw] = rec
                    elif rec["kind"] == "result":
                        raw.append(rec)
                        print(f"  {fw:>5}: median {np.median(rec['step_s']) * 1e3:8.2f} ms/step"
                              f"{'' if rec['ok'] else '  WRONG: replicas differ'}", file=sys.stderr, flush=True)  # fmt: skip
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
        print("Versions: " + "; ".join(f"{fw}: {s.get('version', '')}" for fw, s in starts.items()) + "\n")
    print("Cells: step = the slowest rank's time for one jitted training step (gradients, reduction, optax "
          "update) until its parameters are ready; median and 90th percentile over all rounds' steps.\n")
    for n in args.np:
        print(table(args, n, summaries.get(n, {})))
    wrong = [f"{fw} at N={n}" for n, s in summaries.items() for fw, v in s.items() if not v["ok"]]
    notes += [f"{w}: the replicas' parameters differ after training" for w in wrong]
    finish(notes, elapsed, args.json, {
        "machine": m, "args": {k: v for k, v in vars(args).items() if k not in ("worker", "round")},
        "starts": starts, "summary": {str(n): s for n, s in summaries.items()}, "results": raw,
    })  # fmt: skip
    return 1 if wrong or failed or not raw else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2,4", help="rank counts, comma-separated (default 2,4)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step (default 64)")
    p.add_argument("--layers", default="1024,2048,2048,10", help="MLP widths, comma-separated (%(default)s)")
    p.add_argument("--steps", type=int, default=60, help="timed steps per framework and N, over the rounds (60)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of a launch (3)")
    p.add_argument("--rounds", type=int, default=3, help="times every framework runs, alternating (default 3)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="frameworks in run order (%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the random data (default 0)")
    p.add_argument("--smoke", action="store_true", help="tiny MLP, 2 rounds x 2 timed steps: checks that it runs")
    p.add_argument("--timeout", type=float, default=600, help="seconds one launch may take (default 600)")
    p.add_argument("--json", metavar="PATH", help="also write every step time and the summary as JSON")
    p.add_argument("--worker", choices=sorted(FRAMEWORKS), help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.warmup, args.rounds, args.layers = 4, 1, 2, "32,64,10"
    try:
        args.layer_list = [int(x) for x in args.layers.split(",")]
    except ValueError:
        p.error(f"--layers takes comma-separated integers, got {args.layers!r}")
    if len(args.layer_list) < 2 or min(args.layer_list) < 1:
        p.error("--layers needs at least two positive widths")
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--batch-size, --steps and --rounds must be at least 1, --warmup at least 0")
    if args.worker:
        return worker(args)
    try:
        args.np = parse_counts(args.np)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    bad = [f for f in args.frameworks if f not in FRAMEWORKS]
    if bad or not args.frameworks:
        p.error(f"unknown framework(s) {bad}; choose from {', '.join(FRAMEWORKS)}")
    if args.steps < args.rounds:
        p.error(f"--steps ({args.steps}) must be at least --rounds ({args.rounds})")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
