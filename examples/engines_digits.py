"""One training function, four ways to run it: ``hora run``, ``hora.runner.run``, Ray (``hora.ray``) and Spark
(``hora.spark``).

``train()`` is an ordinary Horovod PyTorch function (a small CNN on scikit-learn's digits); it calls
``hvd.init()`` itself and never asks who started it:

    hora run -np 2 python examples/engines_digits.py             # hora run starts the ranks; each runs train()
    python examples/engines_digits.py --engine runner --np 2     # hora.runner.run(train, np=2)
    python examples/engines_digits.py --engine ray --np 2        # RayExecutor on a local Ray (ray.init())
    python examples/engines_digits.py --engine spark --np 2      # hora.spark.run on Spark's local-cluster[2,1,1024]

Each prints rank 0's result as one JSON line: test accuracy, steps, steps/s, and the seconds from starting the
ranks to the end of the first collective (under ``hora run``, from ``--started-at``, given by whoever started it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def train(epochs: int = 3, batch_size: int = 32, lr: float = 0.025, seed: int = 0, started_at: float = 0.0) -> dict:
    """Train on this rank's shard; return {rank, size, accuracy, steps, steps_per_s, first_collective_s}."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from torch import nn

    import hora.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # ranks on one machine share its cores
    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    test, train_idx = order[: len(x) // 5], order[len(x) // 5 :]
    x = (x - x[train_idx].mean()) / x[train_idx].std()

    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * size, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # the first collective
    first_collective = time.time() - started_at if started_at else float("nan")
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    steps_per_epoch = (len(train_idx) // size) // batch_size
    steps, t0 = 0, time.perf_counter()
    for epoch in range(epochs):
        shard = train_idx[torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(train_idx)))][rank::size]
        model.train()
        for i in range(steps_per_epoch):
            batch = shard[i * batch_size : (i + 1) * batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
            steps += 1
    seconds = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        correct = (model(x[test[rank::size]]).argmax(1) == y[test[rank::size]]).sum()
    correct = hvd.allreduce(correct, name="correct", op=hvd.Sum)
    return {
        "rank": rank,
        "size": size,
        "accuracy": round(100.0 * correct.item() / len(test), 2),
        "steps": steps,
        "steps_per_s": round(steps / seconds, 2) if seconds > 0 else None,
        "first_collective_s": round(first_collective, 3),
    }


def run_on(engine: str, np_: int, kwargs: dict[str, Any]) -> list[dict]:
    """``train(**kwargs)`` on ``np_`` ranks started by ``engine``; every rank's result. ``started_at`` is set when
    the ranks start (after Ray or Spark themselves are up: a cluster is usually running already)."""
    if engine == "runner":
        import hora.runner

        return hora.runner.run(train, kwargs=dict(kwargs, started_at=time.time()), np=np_)
    if engine == "ray":
        import ray

        from hora.ray import RayExecutor

        ray.init(num_cpus=np_, include_dashboard=False)
        executor = RayExecutor(num_workers=np_)
        try:
            kwargs = dict(kwargs, started_at=time.time())
            executor.start()
            return executor.run(train, kwargs=kwargs)
        finally:
            executor.shutdown()
            ray.shutdown()
    if engine == "spark":
        from pyspark.sql import SparkSession

        import hora.spark
        import hora.spark.runner

        path = os.pathsep.join(p for p in sys.path if p)
        spark = (
            SparkSession.builder.master(f"local-cluster[{np_},1,1024]")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executorEnv.PYTHONPATH", path)
            .getOrCreate()
        )
        try:
            while hora.spark.runner.slots(spark.sparkContext) < np_:  # the executors are still starting
                time.sleep(0.2)
            return hora.spark.run(train, kwargs=dict(kwargs, started_at=time.time()), num_proc=np_)
        finally:
            spark.stop()
    raise SystemExit(f"unknown engine {engine!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["runner", "ray", "spark"], default=None,
                   help="start the ranks from here with this engine (default: this process is a rank)")
    p.add_argument("--np", type=int, default=2, help="number of ranks for --engine (default: 2)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--started-at", type=float, default=None,
                   help="time.time() when the launch began (default: now)")
    args = p.parse_args()
    kwargs = {"epochs": args.epochs, "batch_size": args.batch_size, "started_at": args.started_at or time.time()}
    if args.engine is None:  # under hora run (or alone): this process is one rank
        result = train(**kwargs)
        if result["rank"] == 0:
            print(json.dumps(result), flush=True)
        return
    print(json.dumps(run_on(args.engine, args.np, kwargs)[0]), flush=True)


if __name__ == "__main__":
    main()
