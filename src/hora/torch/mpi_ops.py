"""Horovod's collective API on torch tensors (``horovod/torch/mpi_ops.py``'s names, arguments and defaults).

The blocking collectives, with Horovod's gradients (autograd Functions); the lifecycle, topology, build queries and
process sets every adapter shares are :mod:`hora._frontend.surface`'s (re-exported by :mod:`hora.torch`); the
asynchronous calls, ``poll`` and ``synchronize`` live in :mod:`hora.torch.async_ops` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hora import _frontend as _f
from hora._frontend.surface import Average, ProcessSet, Sum, global_process_set
from hora.torch.async_ops import (
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hora.torch.compression import Compression

__all__ = [
    "allgather_async",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather_async",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "poll",
    "reducescatter_async",
    "sparse_allreduce_async",
    "synchronize",
]


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce with a gradient: the gradient of the output is allreduced with the same op and factors."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        h = allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        return synchronize(h)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(
            grad_output,
            average=ctx.average,
            op=ctx.op,
            prescale_factor=ctx.prescale_factor,
            postscale_factor=ctx.postscale_factor,
            process_set=ctx.process_set,
        )
        return grad, None, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks and return the result as a new tensor (default op Average). Gradients
    flow through it: the output's gradient is allreduced the same way."""
    compressed, cctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(
        compressed, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(summed, cctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place allreduce: ``tensor`` holds the result when this returns."""
    return synchronize(
        allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        h = grouped_allreduce_async(
            list(tensors), average, name, op, prescale_factor, postscale_factor, process_set
        )
        return tuple(synchronize(h))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post, process_set = ctx.args
        out = grouped_allreduce(
            list(grads),
            average=average,
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=process_set,
        )
        return (None, None, None, None, None, None, *out)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of the list as one group; returns new tensors. Gradients flow like ``allreduce``'s."""
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedAllreduce.apply(
        average, name, op, prescale_factor, postscale_factor, process_set, *[c for c, _ in pairs]
    )
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    return synchronize(
        grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    )


class HorovodAllgather(torch.autograd.Function):
    """Allgather with a gradient: the output's gradient is averaged over ranks and each rank keeps its rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)
        r = ctx.process_set.rank()
        offset = int(dims[:r].sum()) if r else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0; gradients flow back to each rank's rows."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather every tensor of the list as one group; gradients flow back as for ``allgather``."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


class HorovodGroupedAllgather(torch.autograd.Function):
    """Horovod's: the gradients are averaged over ranks (one grouped allreduce) and each rank keeps its rows."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), average=True, process_set=ctx.process_set)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims], process_set=ctx.process_set)
        r = ctx.process_set.rank()
        return (None, None, *(g.narrow(0, int(d[:r].sum()) if r else 0, n) for g, d, n in zip(reduced, dims, ctx.dims)))


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast with a gradient: the output's gradient is averaged over ranks and lands on the root only."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, average=True, process_set=ctx.process_set)
        if _f.rank() != ctx.root_rank:  # root_rank is a global rank, as in Horovod
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """``root_rank``'s ``tensor`` on every rank, as a new tensor; gradients flow back to the root."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place broadcast: ``tensor`` holds ``root_rank``'s values when this returns."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall with a gradient: the gradient goes back the way the rows came."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received, None, ctx.process_set))
        return grad, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Rows ``splits[r]`` of ``tensor`` go to rank r; returns what this rank received, and — when ``splits`` is
    given — how many rows came from each rank."""
    output, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter with Horovod 0.28's gradient: the allgather of the output's gradient, times the number of ranks
    when op is Sum (not Average), times the pre- and post-scale factors."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.args = (op, process_set, prescale_factor, postscale_factor)
        h = reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        return synchronize(h)

    @staticmethod
    def backward(ctx, grad_output):
        return _scatter_grad(allgather(grad_output, process_set=ctx.args[1]), *ctx.args), None, None, None, None, None


def _scatter_grad(grad: torch.Tensor, op: Any, process_set: ProcessSet, pre: float, post: float) -> torch.Tensor:
    if op == Sum:
        grad = grad * (process_set.size() or 1)
    if pre != 1.0:
        grad = grad * pre
    if post != 1.0:
        grad = grad * post
    return grad


class HorovodGroupedReducescatter(torch.autograd.Function):
    """``HorovodReducescatter``'s gradient for each tensor of a group (one grouped allgather)."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.args = (op, process_set, prescale_factor, postscale_factor)
        h = grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor, postscale_factor)
        return tuple(synchronize(h))

    @staticmethod
    def backward(ctx, *grads):
        gathered = grouped_allgather(list(grads), process_set=ctx.args[1])
        return (None, None, None, None, None, *(_scatter_grad(g, *ctx.args) for g in gathered))


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` over ranks and return this rank's share of dimension 0."""
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatter every tensor of the list as one group."""
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor, *(c for c, _ in pairs)
    )
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank has called barrier()."""
    _f.barrier(process_set)


def join(device: int = -1) -> int:
    """This rank has no more data: until every rank joined, it contributes zeros to the others' allreduces.
    Returns the rank that joined last. ``device`` is accepted for Horovod compatibility (no GPU data plane)."""
    return _f.join()


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """``root_rank``'s picklable ``obj`` on every rank (cloudpickle when installed)."""
    return _f.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    return _f.allgather_object(obj, name, process_set)
