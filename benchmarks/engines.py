"""Engines benchmark: the digits training function of examples/engines_digits.py under every way hora starts ranks,
beside Ray Train's ``TorchTrainer`` and Spark's ``TorchDistributor`` running the equivalent DDP function.

Engines (each run in a fresh Python process, one after the other):

    hora-run           hora run -np N python examples/engines_digits.py
    hora-runner        hora.runner.run(train, np=N)
    hora-ray           hora.ray.RayExecutor(num_workers=N) on a local Ray (ray.init)
    hora-spark         hora.spark.run(train, num_proc=N) on Spark's local-cluster[N,1,1024]
    ray-train          ray.train.torch.TorchTrainer, N workers, DDP on gloo (needs ray[train])
    spark-distributor  pyspark.ml.torch.distributor.TorchDistributor(num_processes=N, local_mode=False), DDP on gloo

Measured, as rank 0 reports it:

    first collective   seconds from starting the ranks to the end of the first collective (hora: the broadcast of
                       the parameters; DDP: its constructor's broadcast). Ray and Spark themselves are up before
                       the clock starts (a cluster usually runs already); hora run starts from the command.
    steps/s            training steps per second on rank 0 (every rank does the same steps), after that
    accuracy           test accuracy after --epochs (a check that every engine trains the same model)

    python benchmarks/engines.py                        # N = 2, 3 epochs, every engine
    python benchmarks/engines.py --np 2 --epochs 1 --engines hora-ray,ray-train --json /tmp/engines.json
    python benchmarks/engines.py --smoke                # 1 epoch, N = 2: checks that every engine runs

Not a test; numbers mean something only on an otherwise idle machine. Record them in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "engines_digits.py"
ENGINES = ["hora-run", "hora-runner", "hora-ray", "hora-spark", "ray-train", "spark-distributor"]


def train_ddp(
    epochs: int, batch_size: int, lr: float, seed: int, started_at: float, launcher: str, out: str | None = None
) -> dict:
    """examples/engines_digits.py's ``train`` with torch DistributedDataParallel (gloo) instead of hora."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip
    if launcher == "ray-train":
        import ray.train.torch

        model = ray.train.torch.prepare_model(model)  # DDP; Ray Train started the gloo group
    else:  # torchrun, as TorchDistributor starts it
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
    first_collective = time.time() - started_at
    rank, size = dist.get_rank(), dist.get_world_size()
    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    test, train_idx = order[: len(x) // 5], order[len(x) // 5 :]
    x = (x - x[train_idx].mean()) / x[train_idx].std()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * size, momentum=0.9)
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
    dist.all_reduce(correct)
    result = {
        "rank": rank,
        "size": size,
        "accuracy": round(100.0 * correct.item() / len(test), 2),
        "steps": steps,
        "steps_per_s": round(steps / seconds, 2) if seconds > 0 else None,
        "first_collective_s": round(first_collective, 3),
    }
    if out and rank == 0:  # Ray Train keeps no return value: rank 0 leaves its result here
        Path(out).write_text(json.dumps(result))
    if launcher == "torchrun":
        dist.destroy_process_group()
    return result


def _ray_train(np_: int, epochs: int) -> dict:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=np_ + 1, include_dashboard=False)
    try:
        with tempfile.TemporaryDirectory() as storage:
            out = os.path.join(storage, "result.json")
            config = {"epochs": epochs, "batch_size": 32, "lr": 0.025, "seed": 0, "launcher": "ray-train",
                      "out": out, "started_at": time.time()}  # fmt: skip
            trainer = TorchTrainer(
                lambda c: train_ddp(**c),
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=np_, use_gpu=False),
                torch_config=TorchConfig(backend="gloo"),
                run_config=RunConfig(storage_path=storage, name="engines-bench"),
            )
            trainer.fit()
            return dict(json.loads(Path(out).read_text()))
    finally:
        ray.shutdown()


def _spark_distributor(np_: int, epochs: int) -> dict:
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    import hora.spark.runner

    spark = (
        SparkSession.builder.master(f"local-cluster[{np_},1,1024]")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        .getOrCreate()
    )
    try:
        while hora.spark.runner.slots(spark.sparkContext) < np_:
            time.sleep(0.2)
        distributor = TorchDistributor(num_processes=np_, local_mode=False, use_gpu=False)
        return distributor.run(train_ddp, epochs, 32, 0.025, 0, time.time(), "torchrun")
    finally:
        spark.stop()


def one(engine: str, np_: int, epochs: int) -> dict[str, Any]:
    """Run Ray Train or the TorchDistributor here (a fresh process started by :func:`main`); rank 0's result."""
    if engine == "ray-train":
        return _ray_train(np_, epochs)
    return _spark_distributor(np_, epochs)


def measure(engine: str, np_: int, epochs: int, timeout: float) -> dict[str, Any]:
    """``engine`` in a fresh process; its result, or the error it ended with."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    if engine == "hora-run":
        command = [sys.executable, "-m", "hora", "run", "-np", str(np_), sys.executable, str(EXAMPLE),
                   "--epochs", str(epochs), "--started-at", str(time.time())]  # fmt: skip
    elif engine.startswith("hora-"):  # the example as a script: its train() is pickled by value for the ranks
        command = [sys.executable, str(EXAMPLE), "--engine", engine.removeprefix("hora-"), "--np", str(np_),
                   "--epochs", str(epochs)]  # fmt: skip
    else:
        command = [sys.executable, __file__, "--one", engine, "--np", str(np_), "--epochs", str(epochs)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"engine": engine, "error": f"timed out after {timeout:g}s"}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        text = line.split(": ", 1)[1] if line.startswith("[0]<stdout>: ") else line
        if text.startswith("{"):
            return {"engine": engine, **json.loads(text), "wall_s": round(wall, 1)}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"engine": engine, "error": f"exit {proc.returncode}: {tail}"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks per engine (default: 2)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of training (default: 3)")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated (default: {','.join(ENGINES)})")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per engine (default: 600)")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--smoke", action="store_true", help="1 epoch: checks that every engine runs")
    p.add_argument("--one", metavar="ENGINE", help=argparse.SUPPRESS)  # internal: run one engine in this process
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.np, args.epochs)), flush=True)
        return
    epochs = 1 if args.smoke else args.epochs
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        p.error(f"unknown engines {unknown}; choose from {ENGINES}")
    results = []
    print(f"{'engine':<18} {'first collective s':>18} {'steps/s':>8} {'accuracy %':>10} {'wall s':>7}")
    for engine in engines:
        r = measure(engine, args.np, epochs, args.timeout)
        results.append(r)
        if "error" in r:
            print(f"{engine:<18} failed: {r['error']}", flush=True)
        else:
            print(f"{engine:<18} {r['first_collective_s']:>18.2f} {r['steps_per_s']:>8.1f} {r['accuracy']:>10.2f} "
                  f"{r['wall_s']:>7.1f}", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"np": args.np, "epochs": epochs, "results": results}, indent=2))


if __name__ == "__main__":
    main()
