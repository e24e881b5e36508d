"""Data-parallel training of a small MLP on scikit-learn's digits, in pure numpy, with hora.

Run it on two processes (or 1, 3, 4 ...):

    hora run -np 2 python examples/numpy_digits.py

Every rank holds a full copy of the model and trains on its own shard of the data. After each backward pass
the gradients are averaged across ranks with allreduce, so every rank applies the same update and the copies
stay identical -- the same recipe Horovod uses, written out by hand so nothing is hidden.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

import hora.numpy as hvd


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10, help="passes over the training data (default: 10)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step on each rank (default: 32)")
    p.add_argument("--lr", type=float, default=0.05,
                   help="learning rate for one rank; scaled by size() (default: 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    p.add_argument("--hidden", type=int, default=64, help="hidden units (default: 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and shuffling")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1:
        p.error("--epochs and --batch-size must be at least 1")
    return args


def load_data(seed: int):
    """The same seeded train/test split on every rank; pixels scaled from 0..16 to 0..1."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def init_params(rng: np.random.Generator, n_in: int, n_hidden: int, n_out: int) -> dict[str, np.ndarray]:
    """Xavier/Glorot-initialised weights, zero biases."""
    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)

    return {"w1": glorot(n_in, n_hidden), "b1": np.zeros(n_hidden, np.float32),
            "w2": glorot(n_hidden, n_out), "b2": np.zeros(n_out, np.float32)}


def forward(params: dict[str, np.ndarray], x: np.ndarray):
    """Logits of the MLP x -> tanh(x w1 + b1) -> h w2 + b2, and h, which the backward pass needs."""
    h = np.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"], h


def loss_and_grads(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray):
    """Mean softmax cross-entropy over the batch and its gradient with respect to every parameter."""
    logits, h = forward(params, x)
    logits = logits - logits.max(axis=1, keepdims=True)  # stable softmax: exp() cannot overflow
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(y)), y].mean()

    # d(loss)/d(logits) of softmax + cross-entropy is (softmax - one_hot) / batch.
    dlogits = np.exp(log_probs)
    dlogits[np.arange(len(y)), y] -= 1.0
    dlogits /= len(y)
    dh = (dlogits @ params["w2"].T) * (1.0 - h * h)  # tanh'(z) = 1 - tanh(z)^2
    grads = {"w2": h.T @ dlogits, "b2": dlogits.sum(axis=0),
             "w1": x.T @ dh, "b1": dh.sum(axis=0)}
    return float(loss), grads


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    x_train, y_train, x_test, y_test = load_data(args.seed)

    # Shard the training set: rank r takes examples r, r + size, r + 2*size, ...  Shards can differ in length
    # by one, but every rank must run the same number of steps per epoch -- each step ends in an allreduce
    # that waits for all ranks, so a rank with an extra step would wait forever. Count on the smallest shard.
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    steps_per_epoch = (len(x_train) // size) // args.batch_size
    if steps_per_epoch == 0:
        raise SystemExit(f"--batch-size {args.batch_size} is larger than a shard ({len(x_train) // size} "
                         f"examples at -np {size}); use a smaller batch size")

    # Each rank draws different random weights here (seed + rank) on purpose: the broadcast from rank 0 is
    # what makes every replica start from the same point. Without it the replicas would drift apart.
    params = init_params(np.random.default_rng(args.seed + rank), x_train.shape[1], args.hidden, 10)
    params = {k: hvd.broadcast(v, root_rank=0, name=f"param.{k}") for k, v in params.items()}
    velocity = {k: np.zeros_like(v) for k, v in params.items()}

    # The global batch is batch_size * size, so scale the learning rate by size() (Goyal et al., as Horovod
    # recommends) and ramp up to it linearly over the first epoch, which keeps the early steps stable.
    peak_lr = args.lr * size
    warmup_steps = steps_per_epoch
    shuffle_rng = np.random.default_rng(args.seed * 1000 + rank)  # each rank shuffles its own shard
    step = 0

    for epoch in range(1, args.epochs + 1):
        order = shuffle_rng.permutation(len(x_shard))
        epoch_loss = 0.0
        for i in range(steps_per_epoch):
            batch = order[i * args.batch_size:(i + 1) * args.batch_size]
            loss, grads = loss_and_grads(params, x_shard[batch], y_shard[batch])
            epoch_loss += loss

            # Start every gradient allreduce before waiting on any, so hora can negotiate them together and
            # fuse them into one message. The names must match across ranks.
            handles = {k: hvd.allreduce_async(g, op=hvd.Average, name=f"grad.{k}") for k, g in grads.items()}
            grads = {k: hvd.synchronize(h) for k, h in handles.items()}

            lr = peak_lr * min(1.0, (step + 1) / warmup_steps)
            for k in params:  # SGD with momentum; identical inputs on every rank -> identical parameters
                velocity[k] = args.momentum * velocity[k] - lr * grads[k]
                params[k] += velocity[k]
            step += 1

        # Training loss averaged over ranks, and test accuracy. Each rank scores a slice of the test set and
        # the correct counts are summed, so the evaluation is data-parallel too.
        train_loss = hvd.allreduce(np.array(epoch_loss / steps_per_epoch), op=hvd.Average, name="train_loss")
        logits, _ = forward(params, x_test[rank::size])
        shard_correct = np.array((logits.argmax(axis=1) == y_test[rank::size]).sum())
        correct = hvd.allreduce(shard_correct, op=hvd.Sum, name="test_correct")
        accuracy = float(correct) / len(x_test)
        if rank == 0:
            print(f"epoch {epoch:3d}  train loss {float(train_loss):.4f}  "
                  f"test accuracy {accuracy:.4f}  lr {lr:.3f}", flush=True)

    if rank == 0:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
