"""Data-parallel training of a small CNN on scikit-learn's digits with PyTorch and hora's Horovod API.

Run it on two processes (or 1, 3, 4 ...), or as a plain single process:

    hora run -np 2 python examples/pytorch_digits.py
    python examples/pytorch_digits.py

The script is a Horovod PyTorch script: replace ``import hora.torch as hvd`` with ``import horovod.torch as hvd``
and it runs under horovodrun unchanged. Every rank holds a full copy of the model and trains on its own shard of
each epoch's shuffle; ``hvd.DistributedOptimizer`` averages the gradients across ranks during the backward pass,
so every rank applies the same update and the copies stay identical.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import hora.torch as hvd


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=12, help="passes over the training data (default: 12)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step on each rank (default: 32)")
    p.add_argument("--lr", type=float, default=0.025,
                   help="learning rate for one rank; scaled by size() (default: 0.025)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    p.add_argument("--warmup-epochs", type=float, default=1.0,
                   help="epochs over which the learning rate ramps up linearly to lr * size() (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and shuffling")
    p.add_argument("--checkpoint", metavar="PATH", default=None,
                   help="after every epoch, rank 0 saves the model and optimizer state here (default: none)")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="send gradients as float16 in the allreduce (hvd.Compression.fp16)")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1:
        p.error("--epochs and --batch-size must be at least 1")
    if args.warmup_epochs < 0:
        p.error("--warmup-epochs must be at least 0")
    return args


def load_data(seed: int):
    """The same seeded train/test split on every rank, as tensors of shape (n, 1, 8, 8)."""
    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    # Standardise with the training set's mean and deviation: zero-centred inputs train much faster than 0..16.
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return x[train], y[train], x[test], y[test]


class Net(nn.Module):
    """Two 3x3 convolutions, a 2x2 max-pool and two fully connected layers: 8x8 digit -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def learning_rate(args: argparse.Namespace, size: int, epoch: int, step: int, steps_per_epoch: int) -> float:
    """Horovod's schedule: ``--lr`` scaled by size(), ramped up linearly over the warm-up, divided by 10 for the
    last quarter of the epochs (a step decay, as in Horovod's ImageNet example)."""
    lr = args.lr * size
    warmup_steps = args.warmup_epochs * steps_per_epoch
    if step < warmup_steps:
        lr *= (step + 1) / warmup_steps
    if epoch > 0.75 * args.epochs:
        lr *= 0.1
    return lr


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    # Ranks on one machine share its cores: one thread each keeps them from oversubscribing it.
    torch.set_num_threads(1)

    x_train, y_train, x_test, y_test = load_data(args.seed)

    # Every rank must run the same number of steps per epoch -- each step ends in allreduces that wait for all
    # ranks, so a rank with an extra step would wait forever. Count on the smallest shard.
    steps_per_epoch = (len(x_train) // size) // args.batch_size
    if steps_per_epoch == 0:
        raise SystemExit(f"--batch-size {args.batch_size} is larger than a shard ({len(x_train) // size} "
                         f"examples at -np {size}); use a smaller batch size")

    model = Net()
    # The global batch is batch_size * size, so the learning rate is scaled by size() (Goyal et al., as Horovod
    # recommends); learning_rate() sets it, with a warm-up, at every step.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    # Every rank starts from rank 0's weights and optimizer state. The shared seed already gives every rank the
    # same initial weights here; the broadcast guarantees it (and carries a checkpoint that only rank 0 loaded).
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    step = 0
    for epoch in range(1, args.epochs + 1):
        # The same shuffle on every rank (seeded by the epoch); rank r takes examples r, r + size, r + 2*size ...
        # of it, so the ranks' batches at step i together are batch i of the shuffle with batch_size * size
        # examples: -np 4 --batch-size 8 --lr 0.0125 trains the same model as -np 1 --batch-size 32 --lr 0.05.
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch]).permutation(len(x_train)))
        shard = order[rank::size]
        model.train()
        epoch_loss = 0.0
        for i in range(steps_per_epoch):
            lr = learning_rate(args, size, epoch, step, steps_per_epoch)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = shard[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()  # starts each gradient's allreduce as soon as it is ready
            optimizer.step()  # waits for the allreduces, then updates the weights
            epoch_loss += loss.item()
            step += 1

        # The training loss averaged over ranks, and the test accuracy: each rank scores a slice of the test set
        # and the correct counts are summed, so the evaluation is data-parallel too.
        train_loss = hvd.allreduce(torch.tensor(epoch_loss / steps_per_epoch), name="train_loss", op=hvd.Average)
        model.eval()
        with torch.no_grad():
            predicted = model(x_test[rank::size]).argmax(dim=1)
        shard_correct = (predicted == y_test[rank::size]).sum()
        correct = hvd.allreduce(shard_correct, name="test_correct", op=hvd.Sum)
        accuracy = 100.0 * correct.item() / len(x_test)
        if rank == 0:
            print(f"epoch {epoch:3d}  train loss {train_loss.item():.4f}  "
                  f"test accuracy {accuracy:6.2f}%  lr {lr:.4f}", flush=True)
            if args.checkpoint:
                torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                           args.checkpoint)

    if rank == 0:
        print(f"final test accuracy: {accuracy:.2f}%", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
