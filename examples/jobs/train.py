"""A SageMaker script-mode training script: logistic regression in numpy, data-parallel with hora.numpy.

Written exactly as for SageMaker: hyperparameters arrive as command-line arguments, the data and model paths
as SM_* variables. Run it as a local 2-host x 2-process job:

    hora job run examples/jobs/job.yaml --wait

Every rank reads the training channel, keeps its share of the rows, and averages its gradient with the other
ranks' by allreduce, so every rank applies the same update. The master host's rank 0 prints the metrics (the
spec's metric_definitions pick them out of the log) and saves the model to SM_MODEL_DIR.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import hora.numpy as hvd


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    # Hyperparameters: SageMaker passes them as --name value.
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=0.5)
    p.add_argument("--batch-size", type=int, default=32)
    # The SageMaker environment.
    p.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
    p.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    p.add_argument("--output-data-dir", default=os.environ.get("SM_OUTPUT_DATA_DIR"))
    p.add_argument("--hosts", type=json.loads, default=os.environ.get("SM_HOSTS", "[]"))
    p.add_argument("--current-host", default=os.environ.get("SM_CURRENT_HOST"))
    return p.parse_args()


def load(directory: str) -> tuple[np.ndarray, np.ndarray]:
    files = sorted(f for f in os.listdir(directory) if f.endswith(".csv"))
    data = np.concatenate([np.loadtxt(os.path.join(directory, f), delimiter=",", skiprows=1) for f in files])
    return data[:, 1:].astype(np.float64), data[:, 0].astype(np.float64)


def main() -> None:
    args = parse_args()
    hvd.init()
    x, y = load(args.train)
    mine = np.arange(hvd.rank(), len(x), hvd.size())  # this rank's share of the rows
    x_local, y_local = x[mine], y[mine]
    w = hvd.broadcast(np.zeros(x.shape[1] + 1), root_rank=0, name="init")
    steps = int(np.ceil(len(x_local) / args.batch_size))
    for epoch in range(1, args.epochs + 1):
        for step in range(steps):
            xb = x_local[step * args.batch_size:(step + 1) * args.batch_size]
            yb = y_local[step * args.batch_size:(step + 1) * args.batch_size]
            p = 1 / (1 + np.exp(-(xb @ w[:-1] + w[-1])))
            grad = np.append(xb.T @ (p - yb), np.sum(p - yb)) / max(len(xb), 1)
            w -= args.learning_rate * hvd.allreduce(grad, op=hvd.Average, name="grad")
        p_all = 1 / (1 + np.exp(-(x_local @ w[:-1] + w[-1])))
        eps = 1e-12
        local = np.array([
            -np.sum(y_local * np.log(p_all + eps) + (1 - y_local) * np.log(1 - p_all + eps)),
            np.sum((p_all > 0.5) == y_local),
            len(y_local),
        ])
        loss_sum, correct, count = hvd.allreduce(local, op=hvd.Sum, name="eval")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train_loss={loss_sum / count:.4f} train_accuracy={correct / count:.4f}", flush=True)
    if hvd.rank() == 0:  # rank 0 runs on the master host, algo-1
        np.save(os.path.join(args.model_dir, "weights.npy"), w)
        with open(os.path.join(args.output_data_dir, "summary.json"), "w") as f:
            json.dump({"hosts": args.hosts, "ranks": hvd.size(), "final_accuracy": float(correct / count)}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
