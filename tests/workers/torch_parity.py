"""Rank functions checking hora.torch against Horovod 0.28's behaviour (issue 13): scale factors on non-float32
tensors, the reducescatter/grouped gradients, refusing scalars in reducescatter, broadcast_optimizer_state before
any backward, and sparse gradients reaching the optimizer sparse."""

from __future__ import annotations

import numpy as np
import torch

import hora.numpy as hnp
import hora.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]  # fmt: skip


def _input(rank: int, dtype: torch.dtype, n: int = 12) -> torch.Tensor:
    values = torch.arange(n, dtype=torch.float64) * (rank + 1) - (0 if dtype is torch.uint8 else 3 * n // 4)
    return values.to(dtype)


def horovod_scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """Horovod's CPU ScaleBuffer: integers in double then truncated, halves in float, float32 by (float) factor."""
    if factor == 1.0:
        return t.clone()
    if t.dtype in (torch.float16, torch.bfloat16):
        return (t.float() * torch.tensor(factor, dtype=torch.float32)).to(t.dtype)
    if t.dtype is torch.float32:
        return t * torch.tensor(factor, dtype=torch.float32)
    return (t.double() * factor).to(t.dtype)  # float64 keeps its type; .to(int) truncates toward zero


def horovod_reduce(tensors: list[torch.Tensor], op: int, pre: float, post: float) -> torch.Tensor:
    """Each rank's tensor prescaled, summed in rank order (halves accumulate in float32; with these inputs the
    sums are exact), then postscaled — Average being Sum with postscale / size."""
    n = len(tensors)
    if op == hvd.Average:
        post = post / n
    scaled = [horovod_scale(t, pre) for t in tensors]
    if scaled[0].dtype in (torch.float16, torch.bfloat16):
        total = sum(s.float() for s in scaled[1:]) + scaled[0].float()
        total = total.to(scaled[0].dtype)
    else:
        total = scaled[0].clone()
        for s in scaled[1:]:
            total = total + s
    return horovod_scale(total, post)


def _same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit, except floating-point sums of 3+ ranks: the order in which ranks are added is the
    transport's (as Horovod's is MPI's or Gloo's), so there the scaling is checked to within rounding."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.is_floating_point and hvd.size() > 2:
        torch.testing.assert_close(actual, expected, msg=what)
    else:
        assert torch.equal(actual, expected), f"{what}:\n{actual}\n!=\n{expected}"


def scale_worker() -> bool:
    """allreduce, grouped_allreduce (fused), reducescatter, grouped_reducescatter and hora.numpy with pre- and
    post-scale factors equal Horovod's results bit for bit, for every dtype; each call twice so that the
    cached (direct) path runs too."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    factors = [(0.7, 1.0), (1.0, 1.3), (0.3, 2.9), (1.0, 1.0)]
    for dtype in DTYPES:
        ins = [_input(r, dtype) for r in range(n)]
        for op in (hvd.Sum, hvd.Average):
            for pre, post in factors:
                what = f"{dtype} op={op} pre={pre} post={post}"
                want = horovod_reduce(ins, op, pre, post)
                rows = [len(want) // n + (1 if r < len(want) % n else 0) for r in range(n)]
                start = sum(rows[:me])
                for attempt in range(2):
                    got = hvd.allreduce(ins[me], op=op, prescale_factor=pre, postscale_factor=post,
                                        name=f"s.{what}")  # fmt: skip
                    _same(got, want, f"allreduce {what} #{attempt}")
                    a, b = hvd.grouped_allreduce([ins[me], ins[me][:5]], op=op, prescale_factor=pre,
                                                 postscale_factor=post, name=f"g.{what}")  # fmt: skip
                    _same(a, want, f"grouped_allreduce {what}")
                    _same(b, horovod_reduce([t[:5] for t in ins], op, pre, post), f"grouped_allreduce[1] {what}")
                    got = hvd.reducescatter(ins[me], op=op, prescale_factor=pre, postscale_factor=post)
                    _same(got, want[start : start + rows[me]], f"reducescatter {what}")
                    (got,) = hvd.grouped_reducescatter([ins[me]], op=op, prescale_factor=pre, postscale_factor=post)
                    _same(got, want[start : start + rows[me]], f"grouped_reducescatter {what}")
                if dtype is not torch.bfloat16:
                    arr = hnp.allreduce(ins[me].numpy(), op=op, prescale_factor=pre, postscale_factor=post)
                    _same(torch.from_numpy(arr), want, f"hora.numpy allreduce {what}")
    hvd.shutdown()
    return True


def gradient_worker() -> list[list[float]]:
    """Gradients of reducescatter (Sum, Average, scale factors), grouped_reducescatter and grouped_allgather with
    a gradient of ones; returns them for the test to compare with Horovod's numbers."""
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    seen = []
    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 3.0)]:
        x = torch.ones(2 * n, 3, requires_grad=True)
        hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post).backward(torch.ones(2, 3))
        y = torch.ones(2 * n, 3, requires_grad=True)
        outs = hvd.grouped_reducescatter([y, y * 2], op=op, prescale_factor=pre, postscale_factor=post)
        (outs[0].sum() + outs[1].sum()).backward()
        assert x.grad is not None and y.grad is not None
        seen.append([float(x.grad.unique().item()), float(y.grad.unique().item())])
    a = torch.full((me + 1, 2), float(me), requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    assert ga.shape == (n * (n + 1) // 2, 2) and gb.shape == (3 * n,)
    (ga * 2).sum().backward(retain_graph=True)
    gb.sum().backward()
    assert a.grad is not None and b.grad is not None
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    seen.append([float(a.grad.unique().item()), float(b.grad.unique().item())])
    hvd.shutdown()
    return seen


def scalar_reducescatter_worker() -> list[str]:
    """reducescatter / grouped_reducescatter of a 0-d tensor raise a ValueError before sending (torch and numpy);
    the next collective then runs normally."""
    hvd.init()
    errors = []
    for call in (
        lambda: hvd.reducescatter(torch.tensor(1.0)),
        lambda: hvd.grouped_reducescatter([torch.ones(2), torch.tensor(2.0)]),
        lambda: hnp.reducescatter(np.float32(1.0)),
        lambda: hnp.grouped_reducescatter([np.array(3, np.int32)]),
    ):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc).split(":")[0])
    assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [float(hvd.size())] * 3
    hvd.shutdown()
    return errors


def optimizer_state_worker() -> list[str]:
    """broadcast_optimizer_state on fresh optimizers (no backward yet: no .grad anywhere), plain and distributed,
    as Horovod does it: zero gradients, one step to create the state, then the root's state everywhere."""
    hvd.init()
    me = hvd.rank()
    notes = []
    for distributed in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        before = [p.detach().clone() for p in model.parameters()]
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (me + 1))
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        state = opt.state_dict()
        assert len(state["state"]) == 4, state["state"].keys()
        assert all(float(s["step"]) == 1.0 for s in state["state"].values())
        assert opt.param_groups[0]["lr"] == 0.01, opt.param_groups[0]["lr"]
        for p, b in zip(model.parameters(), before):
            assert p.grad is not None and not p.grad.any()
            assert torch.equal(p.detach(), b)  # zero gradients: Adam's first step moves nothing
        # training goes on normally afterwards
        opt.zero_grad()
        model(torch.ones(5, 3) * (me + 1)).sum().backward()
        opt.step()
        everyone = hvd.allgather_object([p.detach() for p in model.parameters()])
        if distributed:  # averaged gradients, same state: the same parameters everywhere
            assert all(torch.equal(a, b) for a, b in zip(everyone[0], everyone[-1]))
        notes.append(f"distributed={distributed} ok")
    # a parameter that never gets a gradient (unused), with the state of the used ones already there
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    opt = torch.optim.SGD([*used.parameters(), *unused.parameters()], lr=0.1, momentum=0.9)
    used(torch.ones(2, 3)).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    notes.append(f"partial state: {len(opt.state_dict()['state'])} entries")
    hvd.shutdown()
    return notes


def sparse_adam_worker(sparse_as_dense: bool = False) -> list[float]:
    """nn.Embedding(sparse=True) with SparseAdam under DistributedOptimizer: the optimizer gets a sparse gradient
    (the allgathered rows of every rank; with sparse_as_dense the densified allreduce made sparse again, as
    Horovod's test_sparse_embeddings needs); returns the trained weights."""
    hvd.init()
    me = hvd.rank()
    weights = _sparse_adam_steps(me, hvd.size(), sparse_as_dense)
    everyone = hvd.allgather_object(weights)
    assert all(w == everyone[0] for w in everyone), "weights differ across ranks"
    hvd.shutdown()
    return weights


def _sparse_adam_steps(me: int | None, n: int, sparse_as_dense: bool = False) -> list[float]:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt: torch.optim.Optimizer = torch.optim.SparseAdam(emb.parameters(), lr=0.1)
    if me is not None:
        opt = hvd.DistributedOptimizer(opt, named_parameters=emb.named_parameters(), sparse_as_dense=sparse_as_dense)
        hvd.broadcast_optimizer_state(opt, root_rank=0)  # a fresh SparseAdam: one step on sparse zeros
    else:  # what that does, by hand
        emb.weight.grad = torch.zeros_like(emb.weight).to_sparse()
        opt.step()
    seen_sparse = []
    for step in range(3):
        ids = [torch.tensor([(r + step) % 10, 7]) for r in range(n)]
        opt.zero_grad()
        if me is None:  # one process seeing every rank's lookups; Average = sum of the ranks' gradients / n
            (sum(emb(i).sum() for i in ids) / n).backward()
        else:
            emb(ids[me]).sum().backward()
        opt.step()  # SparseAdam raises for a dense gradient
        seen_sparse.append(emb.weight.grad is not None and emb.weight.grad.is_sparse)
    assert all(seen_sparse), seen_sparse
    return emb.weight.detach().flatten().tolist()


def sparse_adam_reference(n: int) -> list[float]:
    return _sparse_adam_steps(None, n)
