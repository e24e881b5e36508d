"""Worker functions for the hora.torch tests: each runs on every rank and checks its results against torch
computations of what every rank contributed (each rank can rebuild any other rank's input from its rank)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

import hora.torch as hvd

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
ALL = FLOATS + INTS + [torch.bool]


def make(rank: int, dtype: torch.dtype, shape: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    """Small exact values (integers a float16 holds exactly) that differ per rank."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    low = 0 if dtype is torch.uint8 else -5
    return torch.randint(low, 6, shape, generator=g).to(dtype)


def reference(op: int, tensors: list[torch.Tensor]) -> torch.Tensor:
    dtype = tensors[0].dtype
    if dtype is torch.bool:
        stack = torch.stack(tensors)
        return stack.all(0) if op in (hvd.Min, hvd.Product) else stack.any(0)
    stack = torch.stack([t.double() for t in tensors])
    if op == hvd.Sum:
        out = stack.sum(0)
    elif op == hvd.Average:
        out = stack.sum(0) / len(tensors)
    elif op == hvd.Min:
        out = stack.min(0).values
    elif op == hvd.Max:
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    return out.to(dtype)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.dtype.is_floating_point:
        tol = 1e-2 if actual.dtype in (torch.float16, torch.bfloat16) else 1e-6
        torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol, msg=what)
    else:
        assert torch.equal(actual, expected), f"{what}: {actual} != {expected}"


def allreduce_worker() -> int:
    """Every dtype and op, all four call forms, 0-d, empty and non-contiguous tensors, scale factors."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    checked = 0
    for dtype in ALL:
        ops = [hvd.Sum, hvd.Min, hvd.Max] if dtype is torch.bool else [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
        if dtype.is_floating_point:
            ops.append(hvd.Average)
        for op in ops:
            for shape in [(), (0,), (7,), (3, 5)]:
                tag = f"{dtype}.{op}.{shape}"
                inputs = [make(r, dtype, shape) for r in range(n)]
                if op == hvd.Product:
                    inputs = [x.clamp(-2, 2) if dtype is not torch.uint8 else x.clamp(0, 2) for x in inputs]
                expected = reference(op, inputs)
                mine = inputs[me].clone()
                close(hvd.allreduce(mine, op=op, name=f"a.{tag}"), expected, f"allreduce {tag}")
                assert torch.equal(mine, inputs[me]), "allreduce changed its input"
                close(hvd.synchronize(hvd.allreduce_async(mine, op=op, name=f"b.{tag}")), expected, tag)
                inplace = mine.clone()
                assert hvd.allreduce_(inplace, op=op, name=f"c.{tag}") is inplace
                close(inplace, expected, f"allreduce_ {tag}")
                inplace = mine.clone()
                h = hvd.allreduce_async_(inplace, op=op, name=f"d.{tag}")
                assert isinstance(h, int)
                assert hvd.synchronize(h) is inplace
                close(inplace, expected, f"allreduce_async_ {tag}")
                checked += 1
    # non-contiguous input, in place and not
    base = make(me, torch.float32, (6, 4)).t()
    assert not base.is_contiguous()
    expected = reference(hvd.Sum, [make(r, torch.float32, (6, 4)).t() for r in range(n)])
    close(hvd.allreduce(base, op=hvd.Sum, name="nc"), expected, "non-contiguous")
    hvd.allreduce_(base, op=hvd.Sum, name="nc_")
    close(base, expected, "non-contiguous in place")
    # default op is Average; scale factors; the deprecated average= argument
    x = torch.full((5,), float(me + 1))
    close(hvd.allreduce(x), torch.full((5,), (n + 1) / 2), "default Average")
    close(hvd.allreduce(x, average=False), torch.full((5,), n * (n + 1) / 2), "average=False")
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    close(out, torch.full((5,), n * (n + 1) / 2), "scale factors")
    # fp16 compression keeps the dtype it was given
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype is torch.float32
    close(out, torch.full((5,), n * (n + 1) / 2), "fp16 compression")
    hvd.shutdown()
    return checked


def grouped_worker() -> bool:
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    shapes = [(3,), (2, 2), (), (0,), (17,)]
    inputs = [[make(r, torch.float64, s, salt=i) for i, s in enumerate(shapes)] for r in range(n)]
    expected = [reference(hvd.Average, [inputs[r][i] for r in range(n)]) for i in range(len(shapes))]
    for got, exp in zip(hvd.grouped_allreduce(inputs[me]), expected):
        close(got, exp, "grouped_allreduce")
    copies = [t.clone() for t in inputs[me]]
    assert hvd.grouped_allreduce_(copies) == copies
    for got, exp in zip(copies, expected):
        close(got, exp, "grouped_allreduce_")
    h = hvd.grouped_allreduce_async([t.float() for t in inputs[me]], op=hvd.Sum)
    for got, i in zip(hvd.synchronize(h), range(len(shapes))):
        close(got, reference(hvd.Sum, [inputs[r][i].float() for r in range(n)]), "grouped_allreduce_async")
    # grouped allgather and reducescatter
    rows = [torch.arange(r + 1, dtype=torch.int32) + 10 * r for r in range(n)]
    gathered = hvd.grouped_allgather([rows[me], rows[me] * 2])
    close(gathered[0], torch.cat(rows), "grouped_allgather 0")
    close(gathered[1], torch.cat(rows) * 2, "grouped_allgather 1")
    full = [torch.arange(2 * n, dtype=torch.float32) * (r + 1) for r in range(n)]
    total = sum(full)
    outs = hvd.grouped_reducescatter([full[me], full[me] + 1], op=hvd.Sum)
    close(outs[0], total[2 * me : 2 * me + 2], "grouped_reducescatter 0")
    close(outs[1], (total + n)[2 * me : 2 * me + 2], "grouped_reducescatter 1")
    hvd.shutdown()
    return True


def gather_bcast_worker() -> bool:
    """allgather (different first dims, every dtype), broadcast forms, alltoall with splits, reducescatter,
    objects, barrier, poll."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    for dtype in ALL:
        parts = [make(r, dtype, (r + 1, 3), salt=5) for r in range(n)]
        close(hvd.allgather(parts[me], name=f"g.{dtype}"), torch.cat(parts), f"allgather {dtype}")
        root = n - 1
        src = make(root, dtype, (4,), salt=6)
        mine = src.clone() if me == root else torch.zeros(4, dtype=dtype)
        close(hvd.broadcast(mine, root_rank=root, name=f"bc.{dtype}"), src, f"broadcast {dtype}")
        assert hvd.broadcast_(mine, root, name=f"bc_.{dtype}") is mine
        close(mine, src, f"broadcast_ {dtype}")
    scalar = hvd.allgather(torch.tensor(float(me)))
    close(scalar, torch.arange(n, dtype=torch.float32), "allgather of 0-d tensors")
    # alltoall: rank r sends (d + 1) rows to rank d, each row = 100 r + d
    splits = torch.tensor([d + 1 for d in range(n)], dtype=torch.int32)
    send = torch.cat([torch.full((d + 1, 2), 100.0 * me + d) for d in range(n)])
    out, received = hvd.alltoall(send, splits=splits, name="a2a")
    assert received.tolist() == [me + 1] * n
    close(out, torch.cat([torch.full((me + 1, 2), 100.0 * r + me) for r in range(n)]), "alltoall")
    even = hvd.alltoall(torch.arange(2 * n, dtype=torch.int64) + 1000 * me)
    close(even, torch.tensor([1000 * r + 2 * me + k for r in range(n) for k in range(2)]), "alltoall even")
    # reducescatter: rank me gets its rows of the sum
    full = [torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) * (r + 1) for r in range(n)]
    got = hvd.reducescatter(full[me], op=hvd.Sum)
    close(got, sum(full)[me : me + 1], "reducescatter")
    got = hvd.reducescatter(full[me])  # default Average
    close(got, (sum(full) / n)[me : me + 1], "reducescatter average")
    # objects, barrier, poll
    assert hvd.broadcast_object({"from": me, "list": [1, 2]}, root_rank=0) == {"from": 0, "list": [1, 2]}
    assert hvd.allgather_object(("rank", me)) == [("rank", r) for r in range(n)]
    hvd.barrier()
    h = hvd.allreduce_async(torch.ones(3), name="polled")
    while not hvd.poll(h):
        pass
    close(hvd.synchronize(h), torch.ones(3), "poll then synchronize")
    hvd.shutdown()
    return True


def autograd_worker() -> bool:
    """Gradients through allreduce, allgather, broadcast, like Horovod's."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    x = torch.full((4,), float(me + 1), dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, name="ag.ar")
    (y * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    # d/dx of sum_k w_k * sum_r x_r = w on every rank, allreduced (summed) over ranks: n * w
    close(x.grad, n * torch.arange(4.0, dtype=torch.float64), "allreduce grad")

    x = torch.full((me + 1, 2), float(me), dtype=torch.float64, requires_grad=True)
    g = hvd.allgather(x, name="ag.gather")
    weights = torch.arange(g.numel(), dtype=torch.float64).reshape(g.shape)
    (g * weights).sum().backward()
    offset = sum(r + 1 for r in range(me))
    # the output's gradient (weights, the same on every rank) averaged over ranks, then this rank's rows
    close(x.grad, weights[offset : offset + me + 1], "allgather grad")

    x = torch.full((3,), float(me), dtype=torch.float64, requires_grad=True)
    b = hvd.broadcast(x, root_rank=0, name="ag.bcast")
    (b * 2).sum().backward()
    close(x.grad, torch.full((3,), 2.0 if me == 0 else 0.0, dtype=torch.float64), "broadcast grad")
    hvd.shutdown()
    return True


def errors_worker() -> list[str]:
    """Mismatched shapes and dtypes raise on every rank; unsupported dtypes raise locally, naming the dtype."""
    hvd.init()
    me = hvd.rank()
    seen = []
    try:
        hvd.allreduce(torch.ones(3 + me), name="bad.shape")
    except RuntimeError as e:
        seen.append(type(e).__name__ + ": " + str(e))
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.float32 if me == 0 else torch.float64), name="bad.dtype")
    except RuntimeError as e:
        seen.append(type(e).__name__ + ": " + str(e))
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.complex64))
    except ValueError as e:
        seen.append("local: " + str(e))
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), torch.full((2,), float(hvd.size())), "after")
    hvd.shutdown()
    return seen


def reinit_worker() -> list[int]:
    """init() after shutdown() starts afresh; the queries answer honestly."""
    out = []
    for _ in range(2):
        hvd.init()
        out.append(int(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="reinit").item()))
        hvd.shutdown()
    assert not hvd.mpi_built() and not hvd.nccl_built() and not hvd.gloo_enabled() and not hvd.cuda_built()
    return out


# -- DistributedOptimizer and helpers ---------------------------------------------------------------------------------
def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(steps)]


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def elastic_single_rank_worker() -> bool:
    """An elastic job (HOROVOD_ELASTIC=1) at one rank: the optimizer has its hooks from the start (the job may
    grow), so step after step must synchronize what they submitted (the second zero_grad() raised here once) and
    leave each gradient as the rank's own."""
    torch.set_num_threads(1)
    hvd.init()
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        model = _model(seed=6)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())  # fmt: skip
    finally:
        del os.environ["HOROVOD_ELASTIC"]
    assert opt._hooks, "no hooks: an elastic job that grows would not average"
    for x, y in _batches(3, 4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        own = [p.grad.clone() for p in model.parameters()]
        opt.synchronize()
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), own))
        with opt.skip_synchronize():
            opt.step()
    hvd.shutdown()
    return True


def optimizer_worker(per_rank_batch: int, steps: int, options: dict) -> list[float]:
    """Train with DistributedOptimizer on this rank's slice of every global batch; returns the final parameters
    (the test compares them across ranks and with a single process on the whole batches)."""
    torch.set_num_threads(1)
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    model = _model(seed=100 + me)  # different on purpose: broadcast_parameters must make them equal
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **options)
    passes = options.get("backward_passes_per_step", 1)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = _batches(steps * passes, per_rank_batch * n)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = data[step * passes + k]
            mine = slice(me * per_rank_batch, (me + 1) * per_rank_batch)
            (loss_fn(model(x[mine]), y[mine]) / passes).backward()
        opt.step()
    out = _flat(model).tolist()
    hvd.shutdown()
    return out


def single_process_reference(per_rank_batch: int, steps: int, n: int, passes: int = 1) -> list[float]:
    """The same training as optimizer_worker in one process on the whole global batches."""
    torch.set_num_threads(1)
    model = _model(seed=100)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = _batches(steps * passes, per_rank_batch * n)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = data[step * passes + k]
            # mean over ranks of per-rank means = mean over the global batch (equal slices)
            (loss_fn(model(x), y) / passes).backward()
        opt.step()
    return _flat(model).tolist()


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95)),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01),
}


def adasum_training_reference(per_rank_batch: int, steps: int, n: int) -> list[float]:
    """What DistributedOptimizer(op=Adasum) must compute, in one process: every rank keeps its own optimizer (its
    momentum) and steps from the shared parameters on its own slice; the parameters then move by the Adasum of
    the ranks' steps, parameter by parameter (numpy reference of Horovod's formula)."""
    import numpy as np

    from workers.collectives import adasum_reference

    torch.set_num_threads(1)
    shared = _model(seed=100)
    models = [_model(seed=100) for _ in range(n)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    loss_fn = torch.nn.CrossEntropyLoss()
    data = _batches(steps, per_rank_batch * n)
    for x, y in data:
        deltas = []
        for r, (m, opt) in enumerate(zip(models, opts)):
            with torch.no_grad():
                for p, q in zip(m.parameters(), shared.parameters()):
                    p.copy_(q)
            opt.zero_grad()
            mine = slice(r * per_rank_batch, (r + 1) * per_rank_batch)
            loss_fn(m(x[mine]), y[mine]).backward()
            opt.step()
            deltas.append([(p - q).detach().numpy() for p, q in zip(m.parameters(), shared.parameters())])
        with torch.no_grad():
            for i, q in enumerate(shared.parameters()):
                combined = adasum_reference([d[i].astype(np.float64) for d in deltas])
                q.add_(torch.from_numpy(combined.astype(np.float32)))
    return _flat(shared).tolist()


def optimizer_state_worker(kind: str) -> bool:
    """Rank 0 trains a few steps alone (its optimizer state fills up, and its hyper-parameters are changed), then
    broadcast_optimizer_state makes every rank's state equal rank 0's, tensors and scalars."""
    torch.set_num_threads(1)
    hvd.init()
    me = hvd.rank()
    model = _model(seed=1)
    opt = OPTIMIZERS[kind](model.parameters())
    if me == 0:
        for x, y in _batches(3, 5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        for group in opt.param_groups:
            group["lr"] = 0.123
    # Horovod's broadcast_optimizer_state first steps a stateless optimizer once on zero gradients (here on the
    # ranks other than 0), which moves parameters under weight decay (adamw): so parameters are broadcast after
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    state = opt.state_dict()
    everyone = hvd.allgather_object(state)
    ref = everyone[0]
    assert [g["lr"] for g in state["param_groups"]] == [0.123] * len(state["param_groups"])
    assert state["param_groups"] == ref["param_groups"]
    assert state["state"].keys() == ref["state"].keys() and len(ref["state"]) > 0
    for idx, entry in ref["state"].items():
        for key, value in entry.items():
            mine = state["state"][idx][key]
            if isinstance(value, torch.Tensor):
                assert torch.equal(mine, value), (kind, idx, key)
            else:
                assert mine == value, (kind, idx, key)
    # and one more distributed step keeps them equal
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    x, y = _batches(1, 4)[0]
    dopt.zero_grad()
    torch.nn.functional.cross_entropy(model(x + me), y).backward()
    dopt.step()
    flats = hvd.allgather_object(_flat(model))
    assert all(torch.equal(f, flats[0]) for f in flats)
    hvd.shutdown()
    return True


def optimizer_rules_worker() -> list[str]:
    """zero_grad() between backward and step raises; too many backward passes raise; unused parameters get zero
    gradients averaged in; groups give the same result as no groups; broadcast_parameters takes every form."""
    torch.set_num_threads(1)
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    notes = []
    model = _model(seed=3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    x, y = _batches(1, 4)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    try:
        opt.zero_grad()
    except AssertionError as e:
        notes.append("zero_grad: " + str(e))
    opt.step()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    except AssertionError as e:
        notes.append("twice: " + str(e))
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()

    # a parameter only rank 0 uses: the others contribute zeros, so its gradient is averaged over all ranks
    extra = torch.nn.Parameter(torch.ones(2))
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD([extra], lr=1.0), named_parameters=[("extra", extra)])
    opt2.zero_grad()
    if me == 0:
        (extra * 2.0).sum().backward()
    opt2.step()
    expected = 1.0 - 2.0 / n
    assert torch.allclose(extra.detach(), torch.full((2,), expected)), (extra, expected)

    # groups=2, explicit groups (a parameter in none is reduced alone) and no groups give the same parameters
    results = []
    for groups in (None, 2, "explicit"):
        m = _model(seed=4)
        if groups == "explicit":
            ps = list(m.parameters())
            groups = [[ps[-1], ps[0]]]
        o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                     named_parameters=m.named_parameters(), groups=groups)  # fmt: skip
        for xb, yb in _batches(3, 4):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(xb + me), yb).backward()
            o.step()
        results.append(_flat(m))
    assert all(torch.allclose(results[0], r, atol=1e-6) for r in results[1:]), "groups changed the result"

    # broadcast_parameters: state_dict, named_parameters (a generator) and a list all work
    for form in ("state_dict", "named", "list"):
        m = _model(seed=10 + me)
        params = {"state_dict": m.state_dict(), "named": m.named_parameters(), "list": list(m.parameters())}[form]
        hvd.broadcast_parameters(params, root_rank=0)
        flats = hvd.allgather_object(_flat(m))
        assert all(torch.equal(f, flats[0]) for f in flats), form
    try:
        hvd.broadcast_parameters(42, root_rank=0)
    except ValueError as e:
        notes.append("bad params: " + str(e))
    m = _model(seed=5)  # gradients can live only in the default buckets
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                 groups=2, gradient_as_bucket_view=True)  # fmt: skip
    except ValueError as e:
        notes.append("views: " + str(e))
    hvd.shutdown()
    return notes


def mismatched_params_worker() -> str:
    """Rank 1's model has a parameter the others lack: every rank's step must raise, none may hang."""
    torch.set_num_threads(1)
    hvd.init()
    model = _model(seed=0)
    params = list(model.named_parameters())
    if hvd.rank() == 1:
        params.append(("only.on.rank1", torch.nn.Parameter(torch.ones(3))))
    try:
        hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1), named_parameters=params)
    except ValueError as e:
        return type(e).__name__ + ": " + str(e)
    finally:
        hvd.shutdown()
    return "no error"


def raising_backward_worker() -> None:
    """Rank 1 raises inside backward (a hook of its own); rank 0 is left waiting in step() for its gradients."""
    torch.set_num_threads(1)
    hvd.init()
    model = _model(seed=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    x, y = _batches(1, 4)[0]
    out = model(x)
    if hvd.rank() == 1:
        def boom(grad: torch.Tensor) -> torch.Tensor:
            raise ValueError("bad batch on rank 1")
        out.register_hook(boom)
    torch.nn.functional.cross_entropy(out, y).backward()
    opt.step()
    hvd.shutdown()


def sync_batch_norm_worker(shape: tuple[int, ...]) -> bool:
    """SyncBatchNorm on each rank's slice == BatchNorm on the whole batch: outputs, input and weight gradients,
    running statistics; eval mode uses the running statistics."""
    torch.set_num_threads(1)
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    c = shape[1]
    g = torch.Generator().manual_seed(11)
    full = torch.randn((shape[0] * n, *shape[1:]), generator=g, dtype=torch.float64) * 3 + 1
    upstream = torch.randn(full.shape, generator=g, dtype=torch.float64)
    bn_cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
    ref = bn_cls(c).double()
    sync = hvd.SyncBatchNorm(c).double()
    with torch.no_grad():
        for m in (ref, sync):
            m.weight.copy_(torch.linspace(0.5, 1.5, c, dtype=torch.float64))
            m.bias.copy_(torch.linspace(-1, 1, c, dtype=torch.float64))
    rows = slice(me * shape[0], (me + 1) * shape[0])
    for _ in range(2):
        xf = full.clone().requires_grad_(True)
        yf = ref(xf)
        (yf * upstream).sum().backward()
        xl = full[rows].clone().requires_grad_(True)
        yl = sync(xl)
        (yl * upstream[rows]).sum().backward()
        torch.testing.assert_close(yl, yf[rows].detach(), msg="output")
        torch.testing.assert_close(xl.grad, xf.grad[rows], msg="input gradient")
    for name in ("weight", "bias"):
        local = getattr(sync, name).grad
        total = hvd.allreduce(local, op=hvd.Sum, name=f"bn.{name}.grad")
        torch.testing.assert_close(total, getattr(ref, name).grad, msg=f"{name} gradient")
    torch.testing.assert_close(sync.running_mean, ref.running_mean, msg="running mean")
    torch.testing.assert_close(sync.running_var, ref.running_var, msg="running var")
    sync.eval()
    ref.eval()
    torch.testing.assert_close(sync(full[rows]), ref(full[rows]), msg="eval")
    hvd.shutdown()
    return True


def cuda_worker() -> bool:
    """CUDA tensors are staged through host memory; results come back on the tensor's device."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    x = torch.full((5,), float(me + 1), device=dev)
    out = hvd.allreduce(x, op=hvd.Sum, name="cuda.ar")
    assert out.device == dev
    close(out.cpu(), torch.full((5,), n * (n + 1) / 2), "cuda allreduce")
    hvd.allreduce_(x, op=hvd.Sum, name="cuda.ar_")
    assert x.device == dev
    close(x.cpu(), torch.full((5,), n * (n + 1) / 2), "cuda allreduce_")
    g = hvd.allgather(torch.full((1, 2), float(me), device=dev), name="cuda.ag")
    assert g.device == dev
    b = torch.full((3,), float(me), device=dev)
    hvd.broadcast_(b, root_rank=0, name="cuda.bc")
    close(b.cpu(), torch.zeros(3), "cuda broadcast_")
    hvd.shutdown()
    return True


def process_set_worker(static: bool) -> list[str]:
    """Even and odd ranks as two process sets, interleaved with global collectives: each set's results involve its
    members only; a rank outside a set cannot use it; sets can be removed and added again."""
    import threading

    if static:
        evens_ps, odds_ps = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])
        hvd.init(process_sets=[evens_ps, odds_ps])
    else:
        hvd.init()
        evens_ps = hvd.add_process_set([0, 2])
        odds_ps = hvd.add_process_set(hvd.ProcessSet([1, 3]))
    me, n = hvd.rank(), hvd.size()
    assert n == 4, n
    mine, other = (evens_ps, odds_ps) if me % 2 == 0 else (odds_ps, evens_ps)
    assert hvd.global_process_set.ranks == [0, 1, 2, 3] and hvd.global_process_set.rank() == me
    assert hvd.ProcessSet([0, 1]).size() is None  # not registered yet, as in Horovod
    try:
        hvd.add_process_set([2, 0])  # the same ranks as a registered set: every rank raises
    except ValueError as e:
        assert "already exists" in str(e), e
    else:
        raise AssertionError("a duplicate process set was accepted")
    notes = []
    assert mine.included() and not other.included()
    assert mine.size() == 2 and mine.rank() == me // 2
    members = mine.ranks
    for step in range(3):
        x = torch.full((5,), float(me + step))
        got = hvd.allreduce(x, op=hvd.Sum, name=f"set.sum.{step}", process_set=mine)
        close(got, torch.full((5,), float(sum(r + step for r in members))), "set allreduce")
        glob = hvd.allreduce(x, op=hvd.Sum, name=f"global.sum.{step}")
        close(glob, torch.full((5,), float(sum(r + step for r in range(n)))), "global allreduce")
    g = hvd.allgather(torch.tensor([me]), process_set=mine)
    assert g.tolist() == members, g
    b = hvd.broadcast(torch.tensor([float(me)]), root_rank=members[1], process_set=mine)
    assert b.item() == members[1], b
    assert hvd.broadcast_object(("from", me), root_rank=members[0], process_set=mine) == ("from", members[0])
    assert hvd.allgather_object(me, process_set=mine) == members
    hvd.barrier(process_set=mine)
    # two sets at once from two threads: each negotiates on its own
    results: dict[str, torch.Tensor] = {}

    def on_set() -> None:
        results["set"] = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="thread.set", process_set=mine)

    t = threading.Thread(target=on_set)
    t.start()
    results["global"] = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="thread.global")
    t.join(60)
    close(results["set"], torch.full((3,), 2.0), "set from a thread")
    close(results["global"], torch.full((3,), 4.0), "global alongside")
    try:
        hvd.allreduce(torch.ones(1), process_set=other)
    except RuntimeError as e:
        notes.append(str(e))
    # an optimizer on the set keeps its members identical
    torch.manual_seed(me)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=members[0], process_set=mine)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=mine)  # fmt: skip
    opt.zero_grad()
    model(torch.full((4, 3), float(me))).sum().backward()
    opt.step()
    flats = hvd.allgather_object(_flat(model), process_set=mine)
    assert torch.equal(flats[0], flats[1])
    assert hvd.remove_process_set(odds_ps) and hvd.remove_process_set(evens_ps)
    assert not hvd.remove_process_set(evens_ps)
    again = hvd.add_process_set([0, 1, 2])
    if me < 3:
        close(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again), torch.full((1,), 3.0), "re-added")
    try:  # ranks that disagree on a new set's members: every rank raises, naming what each passed
        hvd.add_process_set([0, 1] if me == 0 else [0, 2])
    except ValueError as e:
        assert "rank 0 passed [0, 1]; ranks 1, 2, 3 passed [0, 2]" in str(e), e
    else:
        raise AssertionError("add_process_set with different ranks per rank did not raise")
    hvd.shutdown()
    return notes


def _embedding_steps(sparse: bool, sparse_as_dense: bool, me: int | None, n: int, steps: int) -> torch.Tensor:
    """An embedding bag + linear head trained with SGD; each rank looks up its own rows (some shared)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 4, mode="sum", sparse=sparse), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if me is not None:  # a rank of n; None: one process that sees every rank's lookups
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
    for step in range(steps):
        ids = [torch.tensor([(r * 3 + step) % 20, (r + 7) % 20, 5]) for r in range(n)]
        mine = ids if me is None else ids[me:me + 1]
        opt.zero_grad()
        loss = sum(model(i.unsqueeze(0)).sum() for i in mine) / len(mine)
        loss.backward()
        opt.step()
    return _flat(model)


def sparse_worker(sparse_as_dense: bool) -> list[float]:
    """DistributedOptimizer on sparse embedding gradients (allgathered, or densified) equals one process seeing
    every rank's lookups; sparse_allreduce_async on its own sums duplicate indices."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    t = torch.sparse_coo_tensor(torch.tensor([[me, 4]]), torch.tensor([1.0, float(me)]), (6,))
    got = hvd.synchronize(hvd.sparse_allreduce_async(t, name="sparse.direct", op=hvd.Sum)).coalesce().to_dense()
    expected = torch.zeros(6)
    for r in range(n):
        expected[r] += 1.0
        expected[4] += float(r)
    close(got, expected, "sparse_allreduce_async")
    dense = hvd.sparse_allreduce_async(t, name="sparse.avg", op=hvd.Average)().coalesce().to_dense()
    close(dense, expected / n, "sparse_allreduce_async average")
    flat = _embedding_steps(True, sparse_as_dense, me, n, 4)
    everyone = hvd.allgather_object(flat)
    assert all(torch.equal(everyone[0], f) for f in everyone), "parameters differ across ranks"
    hvd.shutdown()
    return flat.tolist()


def sparse_reference(n: int) -> list[float]:
    return _embedding_steps(False, False, None, n, 4).tolist()


class _MixedModel(torch.nn.Module):
    """Parameters of two dtypes, one of them larger than the first bucket (1 MiB), and one used only on even ranks:
    the optimizer's buckets then number several, one dtype each, and one bucket waits for a gradient that some
    ranks never compute."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.inp = torch.nn.Linear(6, 600)
        self.big = torch.nn.Linear(600, 600)  # 1.44 MB of weights: a bucket of its own
        self.out = torch.nn.Linear(600, 3).double()
        self.extra = torch.nn.Linear(600, 600, bias=False).double()

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        h = torch.tanh(self.big(torch.tanh(self.inp(x)))).double()
        if use_extra:
            h = torch.tanh(self.extra(h))
        return self.out(h)


@contextlib.contextmanager
def _deciding_beside_backward(beside: bool) -> Iterator[None]:
    """Optimizers built inside submit their buckets as if an allreduce could (``beside``) or could not run beside
    the backward pass, whatever this host's cores say; the decision is restored after (the parts share a process)."""
    import hora.torch.buckets

    decide = hora.torch.buckets.beside_backward
    hora.torch.buckets.beside_backward = lambda *_: beside  # type: ignore[assignment]
    try:
        yield
    finally:
        hora.torch.buckets.beside_backward = decide  # type: ignore[assignment]


def _checkpointed_averages(nested_at_both_ends: bool) -> None:
    """Reentrant activation checkpointing runs a backward pass inside the backward pass: the optimizer's gradients
    must still be averaged only once all of them are computed, whether the layers backward reaches first and last
    (the ones the end-of-backward hooks watch) are checkpointed or not."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(8)
    a, b, c = (torch.nn.Linear(5, 5) for _ in range(3))
    plain = [torch.nn.Linear(5, 5) for _ in range(3)]
    for p, q in zip(plain, (a, b, c)):
        p.load_state_dict(q.state_dict())
    layers = [*a.parameters(), *b.parameters(), *c.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(layers, lr=0.1),
                                   named_parameters=[(f"ckpt.{i}", p) for i, p in enumerate(layers)])  # fmt: skip
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(hvd.rank()), requires_grad=True)  # else no grads

    def forward(la: Any, lb: Any, lc: Any, ckpt: bool) -> torch.Tensor:
        def wrap(layer: Any, on: bool) -> Any:
            return (lambda h: checkpoint(layer, h, use_reentrant=True)) if ckpt and on else layer

        ends = nested_at_both_ends
        return wrap(lc, ends)(wrap(lb, not ends)(wrap(la, ends)(x))).tanh().sum()

    forward(a, b, c, ckpt=True).backward()
    opt.synchronize()
    forward(*plain, ckpt=False).backward()
    for i, (p, q) in enumerate(zip(layers, (p for layer in plain for p in layer.parameters()))):
        torch.testing.assert_close(p.grad, hvd.allreduce(q.grad, name=f"ckpt.expected.{i}"))
    with opt.skip_synchronize():
        opt.step()


def bucket_worker(views: bool = False, beside: bool = False) -> bool:
    """DistributedOptimizer's buckets (1 MiB here, so several whatever the host's cores decide for the first one):
    every p.grad after synchronize() is the average of the ranks' gradients (computed here for every rank on a
    plain copy), with an unused parameter counted as zeros. By default a gradient handed out at one step is not
    changed by the next (p.grad never aliases a bucket's buffer); with ``views`` (gradient_as_bucket_view) the small
    gradients live in their bucket's buffer: zero_grad() zeroes them there, model.zero_grad() (None) is recovered
    from, and the results are the same. ``beside``: as where an allreduce can run beside the backward pass (a hook
    per gradient, each bucket going when ready), else every bucket goes when backward ends, whatever this host's
    cores decide. Either way a second backward pass before step() raises."""
    import copy

    torch.set_num_threads(1)
    os.environ["HORA_BUCKET_CAP"] = str(1 << 20)
    try:
        hvd.init()
    finally:
        del os.environ["HORA_BUCKET_CAP"]
    me, n = hvd.rank(), hvd.size()
    model = _MixedModel()
    plain = copy.deepcopy(model)
    with _deciding_beside_backward(beside):
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
            gradient_as_bucket_view=views,
        )
    assert opt._buckets is not None and len(opt._buckets) >= 3, opt._groups
    assert (opt._at_end is None) == beside, opt._at_end
    assert all(len({p.dtype for p in g}) == 1 for g in opt._groups), "a bucket mixes dtypes"
    small = [p for b in opt._buckets for p in b._small_params]
    assert small, "no gradient small enough to live in a bucket's buffer"
    g = torch.Generator().manual_seed(11)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    for step in range(3):
        xs = [torch.randn(4, 6, generator=g) for _ in range(n)]
        expected = {name: torch.zeros_like(p) for name, p in plain.named_parameters()}
        for r in range(n):
            plain.zero_grad()
            plain(xs[r], use_extra=r % 2 == 0).sum().backward()
            for name, p in plain.named_parameters():
                if p.grad is not None:
                    expected[name] += p.grad / n
        if views and step == 2:
            model.zero_grad()  # sets every p.grad to None: the bucket copies them in again
            assert all(p.grad is None for p in small)
        else:
            opt.zero_grad()
            if views and step > 0:  # zeroed in their buffer, still views of it
                assert all(p.grad is not None and not p.grad.any() for p in small)
        model(xs[me], use_extra=me % 2 == 0).sum().backward()
        opt.synchronize()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)
        buffers = {b._flat.untyped_storage().data_ptr() for b in opt._buckets if b._flat is not None}
        in_buffer = [p.grad.untyped_storage().data_ptr() in buffers for p in small]
        assert all(in_buffer) if views else not any(in_buffer), in_buffer
        kept += [(p.grad, p.grad.clone()) for p in model.parameters()]
        with opt.skip_synchronize():
            opt.step()
        for p, q in zip(model.parameters(), plain.parameters()):  # the plain copy follows the averaged step
            with torch.no_grad():
                q.copy_(p)
    if not views:
        for held, value in kept:
            torch.testing.assert_close(held, value, rtol=0, atol=0)
    opt.zero_grad()
    model(xs[me], use_extra=True).sum().backward()
    try:
        model(xs[me], use_extra=True).sum().backward()
        raise RuntimeError("a second backward pass before step() did not raise")
    except AssertionError as e:
        assert "more than backward_passes_per_step" in str(e), e
    opt.synchronize()
    with _deciding_beside_backward(beside):
        for nested_at_both_ends in (True, False):
            _checkpointed_averages(nested_at_both_ends)
    hvd.shutdown()
    return True
