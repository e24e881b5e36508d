"""A Gluon CNN on scikit-learn's digits with hora's Horovod MXNet API: DistributedTrainer, parameters broadcast
from rank 0 (deferred initialization), data sharded with num_parts/part_index, and a rank-0 checkpoint.

    hora run -np 2 python examples/mxnet_digits.py     # in the MXNet environment (. .venv-mxnet/bin/activate)

A Horovod MXNet script: ``import horovod.mxnet as hvd`` is the only change the other way. MXNet 1.9.1 needs
numpy < 1.24 (see docs/mxnet.md for the environment).
"""

from __future__ import annotations

import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hora.mxnet as hvd


class SplitSampler(gluon.data.Sampler):
    """Part ``part_index`` of ``num_parts`` equal parts of the dataset, shuffled each epoch (GluonCV's Horovod
    scripts use this sampler)."""

    def __init__(self, length: int, num_parts: int = 1, part_index: int = 0, seed: int = 0) -> None:
        self.part_len = length // num_parts
        self.start = self.part_len * part_index
        self.rng = np.random.default_rng(seed)

    def __iter__(self):  # type: ignore[no-untyped-def]
        index = self.start + self.rng.permutation(self.part_len)
        return iter(index.tolist())

    def __len__(self) -> int:
        return self.part_len


def build_model() -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(16, kernel_size=3, padding=1, activation="relu"))
        net.add(gluon.nn.MaxPool2D(pool_size=2))
        net.add(gluon.nn.Flatten())
        net.add(gluon.nn.Dense(64, activation="relu"))
        net.add(gluon.nn.Dense(10))
    return net


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="examples per step on each rank")
    p.add_argument("--lr", type=float, default=0.002, help="learning rate for one rank; scaled by size()")
    p.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "checkpoints"))
    args = p.parse_args()

    hvd.init()
    ctx = mx.cpu(hvd.local_rank())  # a GPU script says mx.gpu(hvd.local_rank())
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    xt, xv, yt, yv = train_test_split(x, y.astype(np.float32), test_size=0.2, random_state=0)
    train = gluon.data.ArrayDataset(mx.nd.array(xt), mx.nd.array(yt))
    sampler = SplitSampler(len(train), num_parts=hvd.size(), part_index=hvd.rank(), seed=hvd.rank())
    loader = gluon.data.DataLoader(train, batch_size=args.batch_size, sampler=sampler, last_batch="discard")

    mx.random.seed(hvd.rank())  # different on purpose: broadcast_parameters makes rank 0's the start everywhere
    net = build_model()
    net.initialize(mx.init.Xavier(), ctx=ctx)  # deferred: shapes are known after the first batch
    net.hybridize()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)  # sent when each parameter is initialized
    trainer = hvd.DistributedTrainer(params, "adam", {"learning_rate": args.lr * hvd.size()})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    accuracy = 0.0
    for epoch in range(args.epochs):
        total = 0.0
        for data, label in loader:
            data, label = data.as_in_context(ctx), label.as_in_context(ctx)
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch_size)
            total += float(loss.mean().asscalar())
        mean_loss = float(hvd.allreduce(mx.nd.array([total / len(loader)])).asscalar())
        pred = net(mx.nd.array(xv, ctx=ctx)).argmax(axis=1).asnumpy()
        accuracy = float(np.mean(pred == yv))
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}  test accuracy {accuracy:.4f}")
    if hvd.rank() == 0:  # one copy of the model: rank 0 writes the checkpoint
        os.makedirs(args.model_dir, exist_ok=True)
        net.save_parameters(os.path.join(args.model_dir, "digits-cnn.params"))
        print(f"final test accuracy: {accuracy:.4f}")
        print(f"saved {os.path.join(args.model_dir, 'digits-cnn.params')}")


if __name__ == "__main__":
    main()
