"""MXNet training benchmark: hora.mxnet.DistributedTrainer step time vs one process with a plain gluon.Trainer.

The same Gluon MLP (784 -> 1024 -> 1024 -> 10, 1.9 M float32 parameters), random data of the same shape and the same
per-worker batch (``--batch-size``, default 64), MXNet's operators on ``--threads`` threads (default 1, so N ranks
on N cores compare with one process on one core):

    single        one process, ``gluon.Trainer(kvstore=None)``: the step without any communication
    hora          N ranks under ``hora run``, ``hora.mxnet.DistributedTrainer``: the same step plus the allreduce
                  of every gradient (7.6 MB per step)

Driver (default)::

    python benchmarks/mxnet_training.py                    # single, then N = 2 and 4, interleaved, 3 rounds
    python benchmarks/mxnet_training.py --np 2 --json /tmp/mxnet_training.json
    python benchmarks/mxnet_training.py --smoke            # a few steps of a small model: checks that it runs

Method. Rounds alternate single / N=2 / N=4 launches. In a launch the trainer runs ``--warmup`` untimed steps and
``--steps`` timed ones, each ending with ``wait_to_read`` on the loss and on every weight (MXNet is asynchronous);
the median step time is kept. The overhead of distribution is the N-rank median minus the single-process median.
Horovod's documentation publishes no MXNet numbers on CPUs, so there is nothing of theirs to compare with here.

Worker (``--worker single|hora``): runs inside every rank and prints ``HORA_BENCH {json}`` lines from rank 0.
MXNet 1.9.1 needs numpy < 1.24: run this with .venv-mxnet/bin/python (docs/mxnet.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
from _common import emit, finish, hora_command, machine, parse_counts, run_ranks

LAYERS = (784, 1024, 1024, 10)
SMOKE_LAYERS = (32, 16, 10)


# -- worker --------------------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import mxnet as mx
    from mxnet import autograd, gluon

    layers = SMOKE_LAYERS if args.smoke else LAYERS
    distributed = args.worker == "hora"
    if distributed:
        import hora.mxnet as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        rank, size = 0, 1
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    for width in layers[1:-1]:
        net.add(gluon.nn.Dense(width, activation="relu"))
    net.add(gluon.nn.Dense(layers[-1]))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    rng = np.random.default_rng(rank)
    data = mx.nd.array(rng.standard_normal((args.batch_size, layers[0]), np.float32))
    label = mx.nd.array(rng.integers(0, layers[-1], args.batch_size).astype(np.float32))
    net(data)  # shapes known: the parameters exist before the trainer is made
    params = net.collect_params()
    if distributed:
        hvd.broadcast_parameters(params, root_rank=0)
        trainer: Any = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.01})
    else:
        trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.01}, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    weights = [p.data() for p in params.values()]
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(args.batch_size)
        loss.wait_to_read()
        for w in weights:
            w.wait_to_read()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    nbytes = sum(w.size * 4 for w in weights)
    emit(rank, {"kind": "result", "framework": args.worker, "np": size, "step_s": median,
                "samples_per_s_per_worker": args.batch_size / median, "gradient_bytes": int(nbytes)})  # fmt: skip
    emit(rank, {"kind": "done"})
    if distributed:
        hvd.shutdown()


# -- driver --------------------------------------------------------------------------------------------------------
def _command(kind: str, n: int, args: argparse.Namespace) -> list[str]:
    me = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--batch-size", str(args.batch_size),
          "--threads", str(args.threads), "--warmup", str(args.warmup), "--steps", str(args.steps)]  # fmt: skip
    if args.smoke:
        me.append("--smoke")
    return me if kind == "single" else [*hora_command(n), *me]


def driver(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)
    results: dict[str, list[float]] = {}
    notes: list[str] = []
    launches = [("single", 1)] + [("hora", n) for n in args.np]
    for _ in range(args.rounds):
        for kind, n in launches:
            records, error = run_ranks(_command(kind, n, args), env, args.timeout)
            if error:
                notes.append(f"{kind} N={n}: {error}")
                continue
            for r in records:
                if r["kind"] == "result":
                    results.setdefault(f"{kind}-{n}", []).append(r["step_s"])
    single = statistics.median(results["single-1"]) if results.get("single-1") else None
    print(f"MXNet DistributedTrainer, batch {args.batch_size} per worker, {args.threads} thread(s) per worker\n")
    print(f"{'launch':>10} {'step (median)':>14} {'samples/s/worker':>17} {'overhead':>10}")
    for key, values in results.items():
        step = statistics.median(values)
        over = "" if single is None or key == "single-1" else f"{(step - single) * 1e3:+.2f} ms"
        print(f"{key:>10} {step * 1e3:>11.2f} ms {args.batch_size / step:>17.0f} {over:>10}")
    print()
    finish(notes, time.perf_counter() - started, args.json, {"machine": machine(), "results": results})
    return 1 if notes else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=["single", "hora"])
    p.add_argument("--np", type=parse_counts, default=[2, 4])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json")
    p.add_argument("--smoke", action="store_true", help="a small model, 1 round, N=2, 3 steps")
    args = p.parse_args()
    if args.smoke and args.worker is None:
        args.np, args.rounds, args.warmup, args.steps = [2], 1, 1, 3
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
