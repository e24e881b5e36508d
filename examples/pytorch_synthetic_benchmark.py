"""Training throughput on random data with hora's Horovod API: Horovod's pytorch_synthetic_benchmark.py.

Run it on two processes (or 1, 3, 4 ...):

    hora run -np 2 python examples/pytorch_synthetic_benchmark.py
    hora run -np 2 python examples/pytorch_synthetic_benchmark.py --model mlp --fp16-allreduce

Every rank trains the same model on the same random batch (the numbers measure speed, not learning): a forward
and backward pass, then ``hvd.DistributedOptimizer`` averages the gradients across ranks. The models are defined
here, so torchvision is not needed: ``cnn`` (default), a small convolutional network on 3x32x32 images, and
``mlp``, a wide multi-layer perceptron whose steps are dominated by communication. It prints images per second
per worker for every iteration and, at the end, the mean with a 95 % interval (1.96 standard deviations) and the
total over all workers -- the lines Horovod's benchmark prints.
"""

from __future__ import annotations

import argparse
import os
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hora.torch as hvd

IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10


def cnn() -> nn.Module:
    """Four 3x3 convolutions in two pooled stages and a linear classifier (~0.3 M parameters)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, CLASSES),
    )


def mlp() -> nn.Module:
    """Flattened image -> 2048 -> 2048 -> 10 (~10.5 M parameters, little compute per parameter)."""
    n_in = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
    return nn.Sequential(
        nn.Flatten(), nn.Linear(n_in, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, CLASSES),
    )


MODELS = {"cnn": cnn, "mlp": mlp}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--model", choices=sorted(MODELS), default="cnn", help="model to benchmark")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size")
    p.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count "
                   "towards benchmark")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
    p.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    p.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    args = p.parse_args()
    if min(args.batch_size, args.num_batches_per_iter, args.num_iters) < 1 or args.num_warmup_batches < 0:
        p.error("--batch-size, --num-batches-per-iter and --num-iters must be at least 1, "
                "--num-warmup-batches at least 0")
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per local rank
    else:
        # The ranks on one machine share its cores: split them, rather than every rank starting a thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(0)

    model = MODELS[args.model]()
    if args.cuda:
        model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)  # learning rate scaled by the worker count
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, *IMAGE_SHAPE)
    target = torch.randint(0, CLASSES, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    device = "GPU" if args.cuda else "CPU"
    n_params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({n_params:,} parameters)")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {size}")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {img_sec:.1f} img/sec per worker")
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per worker: {img_sec_mean:.1f} +- {img_sec_conf:.1f}")
    log(f"Total img/sec on {size} worker(s): {size * img_sec_mean:.1f} +- {size * img_sec_conf:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
