"""Where a DistributedOptimizer step's time goes: a model of torch_training.py (the many-parameter one by default),
stepped in one launch by kinds that add one part of the optimizer's work at a time, interleaved iteration by
iteration.

    hora run -np 2 python benchmarks/torch_step_parts.py [--model many|mlp] [--steps 150] [--kinds compute,one,...]

Kinds (each on its own copy of the model, all starting from the same weights):

    compute       forward + backward + SGD step, no communication
    one           + one blocking allreduce of a buffer as large as all the gradients (issue 28's yardstick)
    copies        + the gradients copied into that buffer, allreduced, copied back into p.grad
    async         copies, the allreduce submitted asynchronously and waited for (the optimizer's path)
    hooks         async, with an empty post-accumulate-grad hook on every parameter
    optimizer     hora.torch.DistributedOptimizer as it is (on CPUs the ranks fill: every bucket when backward ends)
    views         DistributedOptimizer(gradient_as_bucket_view=True): the gradients live in the bucket
    per-gradient  DistributedOptimizer with a hook per gradient, each bucket going when its last one is ready,
                  as where an allreduce can run beside the backward pass
    small-first   per-gradient, with DDP's 1 MiB first bucket

Rank 0 prints each kind's median step (the slowest rank's) and the median over iterations of its difference from
compute (the kinds run back to back in each iteration, so the machine's drift cancels).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ("compute", "one", "copies", "async", "hooks", "optimizer", "views", "per-gradient", "small-first")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("many", "mlp"), default="many", help="torch_training.py's model")
    parser.add_argument("--steps", type=int, default=150, help="timed iterations (each runs every kind once)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations first")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if kinds[0] != "compute" or not set(kinds) <= set(KINDS):
        parser.error(f"--kinds: compute first, then any of {', '.join(KINDS[1:])}")

    import torch
    import torch.nn.functional as F
    from torch_training import CLASSES, LAYERS, WIDTH, make_model

    import hora.torch as hvd
    import hora.torch.buckets as hora_buckets
    from hora.torch.mpi_ops import grouped_allreduce_async_, synchronize

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    base = make_model(args.model)
    width, classes = (WIDTH, WIDTH) if args.model == "many" else (LAYERS[0], CLASSES)
    x = torch.randn(32, width, generator=torch.Generator().manual_seed(1 + hvd.rank()))
    y = torch.randint(0, classes, (32,), generator=torch.Generator().manual_seed(2 + hvd.rank()))
    flat = torch.zeros(sum(p.numel() for p in base.parameters()))
    models: dict[str, tuple[Any, Any]] = {}
    for kind in kinds:
        model = make_model(args.model)
        model.load_state_dict(base.state_dict())
        opt: Any = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if kind == "hooks":
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(lambda _p: None)
        if kind in ("optimizer", "views", "per-gradient", "small-first"):
            beside, first = hora_buckets.beside_backward, hora_buckets.first_bucket
            if kind in ("per-gradient", "small-first"):  # as if a core were free for the engine thread
                hora_buckets.beside_backward = lambda *_: True  # type: ignore[assignment]
            if kind == "per-gradient":
                hora_buckets.first_bucket = lambda cap, _beside: cap  # type: ignore[assignment]
            named = [(f"{kind}.{k}", p) for k, p in model.named_parameters()]
            opt = hvd.DistributedOptimizer(opt, named_parameters=named, gradient_as_bucket_view=kind == "views")
            hora_buckets.beside_backward, hora_buckets.first_bucket = beside, first  # type: ignore[assignment]
        models[kind] = (model, opt)
    views = [s.view(p.shape) for s, p in zip(flat.split([p.numel() for p in base.parameters()]), base.parameters())]

    def step(kind: str) -> None:
        model, opt = models[kind]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if kind == "one":
            hvd.allreduce_(flat, name="parts.one")
        elif kind in ("copies", "async", "hooks"):
            grads = [p.grad for p in model.parameters()]
            torch._foreach_copy_(views, grads)
            if kind == "copies":
                hvd.allreduce_(flat, name="parts.copies")
            else:
                synchronize(grouped_allreduce_async_([flat], name=f"parts.{kind}"))
            torch._foreach_copy_(grads, views)
        opt.step()

    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(args.warmup + args.steps):
        for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
            hvd.barrier()
            t0 = time.perf_counter()
            step(kind)
            if i >= args.warmup:
                times[kind].append(time.perf_counter() - t0)
    slowest = {k: hvd.allreduce(torch.tensor(t, dtype=torch.float64), op=hvd.Max, name=f"parts.t.{k}")
               for k, t in times.items()}
    if hvd.rank() == 0:
        compute = slowest["compute"]
        print(f"{'kind':<12} {'step ms':>8} {'adds ms':>8}")
        for kind in kinds:
            step_ms = statistics.median(slowest[kind].tolist()) * 1e3
            adds_ms = statistics.median((slowest[kind] - compute).tolist()) * 1e3
            print(f"{kind:<12} {step_ms:8.2f} {adds_ms:8.2f}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
