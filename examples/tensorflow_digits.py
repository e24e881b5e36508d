"""A TensorFlow 2 custom training loop on scikit-learn's digits with hora's Horovod API: DistributedGradientTape
inside a tf.function, and the variables broadcast from rank 0 after the first step.

    hora run -np 2 python examples/tensorflow_digits.py

A Horovod TensorFlow script: ``import horovod.tensorflow as hvd`` is the only change the other way.
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hora.tensorflow as hvd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="examples per step on each rank")
    p.add_argument("--lr", type=float, default=0.002, help="learning rate for one rank; scaled by size()")
    args = p.parse_args()

    hvd.init()
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xt, xv, yt, yv = train_test_split(x, y, test_size=0.2, random_state=0)
    data = tf.data.Dataset.from_tensor_slices((xt, yt.astype(np.int64)))
    data = hvd.shard(data.shuffle(len(xt), seed=0, reshuffle_each_iteration=True), by="rank")
    data = data.batch(args.batch_size)

    tf.random.set_seed(hvd.rank())  # different on purpose: the broadcast after the first step equalises them
    model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])  # fmt: skip
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor, first: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:  # after the first apply, so the optimizer's slots exist
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    first = True
    for epoch in range(args.epochs):
        # the shards may differ in length by a batch: every rank takes as many steps as the shortest
        steps = int(hvd.allreduce(tf.constant(len(list(data))), op=hvd.Min))
        for xb, yb in data.take(steps):
            loss = step(xb, yb, first)
            first = False
        accuracy = float(np.mean(np.argmax(model(xv), axis=1) == yv))
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:3d}  loss {float(loss):.4f}  test accuracy {accuracy:.4f}")
    if hvd.rank() == 0:
        print(f"final test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
