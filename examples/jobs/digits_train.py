"""A SageMaker script-mode training script for scikit-learn's digits: softmax regression in numpy, data-parallel with
hora.numpy. examples/jobs/tune_digits.py tunes its hyperparameters (and writes the channels' CSV files).

Written exactly as for SageMaker: hyperparameters arrive as command-line arguments, the channels and the model
directory as SM_* variables. Every rank reads the training channel and keeps its share of the rows; gradients are
averaged by allreduce, so every rank applies the same update. After each epoch rank 0 prints the training loss and
the validation accuracy (the tuner's metric_definitions pick them out of the log) and at the end saves the model to
SM_MODEL_DIR (weights.npy: 64 pixel weights and a bias for each of the 10 digits).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import hora.numpy as hvd

PIXEL_MAX = 16.0  # digits' pixels are 0..16


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    # Hyperparameters: SageMaker passes them as --name value.
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=0.5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--l2", type=float, default=0.0)
    # The SageMaker environment.
    p.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
    p.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    p.add_argument("--validation", default=os.environ.get("SM_CHANNEL_VALIDATION"))
    p.add_argument("--output-data-dir", default=os.environ.get("SM_OUTPUT_DATA_DIR"))
    return p.parse_args()


def load(directory: str) -> tuple[np.ndarray, np.ndarray]:
    """The channel's CSV files (label first, then the 64 pixels) as scaled features and integer labels."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".csv"))
    data = np.concatenate([np.loadtxt(os.path.join(directory, f), delimiter=",", skiprows=1, ndmin=2)
                           for f in files])
    return data[:, 1:] / PIXEL_MAX, data[:, 0].astype(np.int64)


def predict(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The digit each row of ``x`` (pixels scaled to 0..1) most probably shows."""
    return np.argmax(x @ weights[:-1] + weights[-1], axis=1)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def main() -> None:
    args = parse_args()
    hvd.init()
    x, y = load(args.train)
    x_val, y_val = load(args.validation) if args.validation else (x, y)
    classes = 10
    mine = np.arange(hvd.rank(), len(x), hvd.size())  # this rank's share of the rows
    x_local, y_local = x[mine], y[mine]
    onehot = np.eye(classes)[y_local]
    rng = np.random.default_rng(0)
    w = hvd.broadcast(rng.normal(0, 0.01, (x.shape[1] + 1, classes)), root_rank=0, name="init")
    # Every rank takes the same number of steps (the allreduce needs all of them), some with a short last batch.
    steps = int(hvd.allreduce(np.array([np.ceil(len(x_local) / args.batch_size)]), op=hvd.Max, name="steps")[0])
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_local))
        for step in range(steps):
            rows = order[step * args.batch_size:(step + 1) * args.batch_size]
            xb, yb = x_local[rows], onehot[rows]
            p = softmax(xb @ w[:-1] + w[-1])
            grad = np.vstack([xb.T @ (p - yb), np.sum(p - yb, axis=0)]) / max(len(xb), 1)
            grad[:-1] += args.l2 * w[:-1]
            w -= args.learning_rate * hvd.allreduce(grad, op=hvd.Average, name="grad")
        p_all = softmax(x_local @ w[:-1] + w[-1])
        local = np.array([-np.sum(np.log(p_all[np.arange(len(y_local)), y_local] + 1e-12)), len(y_local)])
        loss_sum, count = hvd.allreduce(local, op=hvd.Sum, name="loss")
        accuracy = float(np.mean(predict(w, x_val) == y_val))
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train_loss={loss_sum / count:.4f} validation_accuracy={accuracy:.4f}", flush=True)
    if hvd.rank() == 0:  # rank 0 runs on the master host, algo-1
        np.save(os.path.join(args.model_dir, "weights.npy"), w)
        if args.output_data_dir:
            with open(os.path.join(args.output_data_dir, "summary.json"), "w") as f:
                json.dump({"ranks": hvd.size(), "validation_accuracy": accuracy}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
