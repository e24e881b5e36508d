"""Data-parallel training of a small MLP on scikit-learn's digits with JAX, optax and hora.jax.

Run it on two processes (or 1, 3, 4 ...):

    hora run -np 2 python examples/jax_digits.py

The training step is one ``jax.jit``-compiled function: forward, ``jax.value_and_grad``, and an optax update
wrapped in ``hora.jax.DistributedOptimizer``, which averages the whole gradient pytree across the ranks in one
collective per step (a host callback inside the compiled step). Every step takes a global batch of
``--batch-size`` examples, the same on every rank, and rank r trains on its r-th slice of it; the average of the
ranks' gradients is then the gradient of the whole batch, so N ranks follow the same trajectory as one process
(up to float rounding), just faster per step.
"""

from __future__ import annotations

import argparse
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import hora.jax as hvd


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10, help="passes over the training data (default: 10)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch, split over the ranks (default: 32)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default: 0.1)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    p.add_argument("--hidden", type=int, default=64, help="hidden units (default: 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and shuffling")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        p.error("--epochs and --batch-size must be at least 1")
    return args


def load_data(seed: int):
    """The same seeded train/test split on every rank; pixels scaled from 0..16 to 0..1."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def init_params(rng: np.random.Generator, n_in: int, n_hidden: int, n_out: int) -> dict[str, jax.Array]:
    """Glorot-uniform weights, zero biases (drawn with numpy: eager jax.random would compile a kernel per op)."""
    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)

    params = {"w1": glorot(n_in, n_hidden), "b1": np.zeros(n_hidden, np.float32),
              "w2": glorot(n_hidden, n_out), "b2": np.zeros(n_out, np.float32)}
    return {k: jax.device_put(v) for k, v in params.items()}


def logits(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over this rank's slice of the batch."""
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()


def digest(params: dict[str, jax.Array]) -> str:
    """A hash of every weight's bytes: equal on every rank exactly when the replicas are bitwise identical."""
    h = hashlib.sha256()
    for k in sorted(params):
        h.update(np.asarray(params[k]).tobytes())
    return h.hexdigest()[:16]


def train(args: argparse.Namespace, log: bool = True) -> tuple[float, dict[str, jax.Array]]:
    """Train on every rank; returns the test accuracy and this rank's parameters."""
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = load_data(args.seed)
    if args.batch_size < size:
        raise SystemExit(f"--batch-size {args.batch_size} is smaller than the number of ranks ({size})")
    # rank r's slice of every global batch (np.array_split: the first ranks take one more when it does not divide)
    bounds = np.cumsum([0, *[len(s) for s in np.array_split(np.arange(args.batch_size), size)]])
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    steps_per_epoch = len(x_train) // args.batch_size

    # Each rank draws different weights here (seed + rank) on purpose: broadcast_parameters from rank 0 is what
    # makes every replica start from the same point.
    params = init_params(np.random.default_rng(args.seed + rank), x_train.shape[1], args.hidden, 10)
    params = hvd.broadcast_parameters(params, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optax.sgd(args.lr, momentum=args.momentum))
    opt_state = jax.jit(optimizer.init)(params)  # one compiled call instead of one small kernel per leaf

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)  # the gradients are averaged here
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def correct(params, x, y):
        return jnp.sum(jnp.argmax(logits(params, x), axis=1) == y)

    shuffle = np.random.default_rng(args.seed + 1)  # the same order on every rank: they split each batch
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        order = shuffle.permutation(len(x_train))
        total = 0.0
        for i in range(steps_per_epoch):
            batch = order[i * args.batch_size : (i + 1) * args.batch_size][lo:hi]
            params, opt_state, loss = step(params, opt_state, x_train[batch], y_train[batch])
            total += float(loss)
        # Data-parallel evaluation: each rank scores a slice of the test set, the counts are summed.
        hits = hvd.allreduce(correct(params, x_test[rank::size], y_test[rank::size]), op=hvd.Sum, name="correct")
        train_loss = hvd.allreduce(jnp.float32(total / steps_per_epoch), name="train_loss")
        accuracy = float(hits) / len(x_test)
        if log and rank == 0:
            print(f"epoch {epoch:3d}  train loss {float(train_loss):.4f}  test accuracy {accuracy:.4f}", flush=True)
    return accuracy, params


def main() -> None:
    args = parse_args()
    hvd.init()
    accuracy, params = train(args)
    same = len(set(hvd.allgather_object(digest(params)))) == 1
    if hvd.rank() == 0:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
        print(f"replicas identical on {hvd.size()} ranks: {'yes' if same else 'NO'}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
