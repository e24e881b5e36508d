"""Data-parallel Keras 3 training on scikit-learn's digits with hora's Horovod API: DistributedOptimizer, a
learning-rate warm-up and a best-model checkpoint written by rank 0.

    hora run -np 2 python examples/keras_digits.py
    python examples/keras_digits.py

It is a Horovod Keras script: ``import horovod.tensorflow.keras as hvd`` is the only change the other way (on
Keras 3 Horovod would not average the gradients, which is why hora exists here). Each rank trains on its own shard;
the optimizer averages the gradients of every step over the ranks, so the copies of the model stay identical.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hora.tensorflow.keras as hvd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="examples per step on each rank")
    p.add_argument("--lr", type=float, default=0.002, help="learning rate for one rank; scaled by size()")
    p.add_argument("--warmup-epochs", type=int, default=2)
    p.add_argument("--checkpoint", default=None, help="rank 0 keeps the best model (by val_loss) here (.keras)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import keras

    hvd.init()
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xt, xv, yt, yv = train_test_split(x, y, test_size=0.2, random_state=args.seed)
    xt, yt = xt[hvd.rank() :: hvd.size()], yt[hvd.rank() :: hvd.size()]  # this rank's shard

    keras.utils.set_random_seed(args.seed + hvd.rank())  # the first callback makes the weights equal
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip
    lr = args.lr * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs),
    ]
    if args.checkpoint:
        callbacks.append(hvd.callbacks.BestModelCheckpoint(os.path.abspath(args.checkpoint), monitor="val_loss"))
    model.fit(
        xt, yt, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
        validation_data=(xv[hvd.rank() :: hvd.size()], yv[hvd.rank() :: hvd.size()]),
        verbose=2 if hvd.rank() == 0 else 0,
    )  # fmt: skip
    _, accuracy = model.evaluate(xv, yv, verbose=0)
    if hvd.rank() == 0:
        print(f"final test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
