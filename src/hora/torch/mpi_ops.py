"""Horovod's collective API on torch tensors (``horovod/torch/mpi_ops.py``'s names, arguments and defaults).

CPU tensors are handed to the engine without a copy where torch allows it: a contiguous tensor's memory is viewed as
a numpy array (bfloat16 through an int16 view), in-place operations write straight into it, and the outputs of the
out-of-place operations are torch tensors the engine writes into. Non-contiguous tensors are made contiguous first
(in-place operations copy the result back). CUDA tensors are staged through host memory and the results copied back
to the tensor's device (there is no GPU data plane yet).

Asynchronous calls return an integer handle, as Horovod's do; ``synchronize(handle)`` returns the output tensor.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

from hora import _frontend as _f
from hora._frontend import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hora._process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from hora._process_sets import scope as _scope
from hora._process_sets import set_root as _set_root
from hora.errors import HoraError
from hora.torch.compression import Compression

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "cross_rank",
    "cross_size",
    "global_process_set",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "remove_process_set",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]

HorovodInternalError = HoraError
"""What a failed collective raises (Horovod's name; every hora error is a ``RuntimeError``)."""

_NUMPY_OF: dict[torch.dtype, np.dtype] = {
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.bool: np.dtype(np.bool_),
}
_TORCH_OF = {v: k for k, v in _NUMPY_OF.items()}


def init(comm: Any = None, process_sets: Any = None, **settings: Any) -> None:
    """Start hora in this process (idempotent; ``init()`` after ``shutdown()`` starts afresh). ``settings``
    override :class:`hora.Config` fields (e.g. ``transport="tcp"``)."""
    if comm is not None:
        raise _f.UnsupportedError(
            "init(comm=...) is not supported: hora takes its ranks from the launcher (hora run, mpirun, srun, "
            "torchrun); call init() without comm"
        )
    _f.init(**settings)
    if process_sets == "dynamic":  # Horovod's switch for add/remove after init: always on in hora
        return
    for ps in process_sets or []:  # static process sets: registered in order, as every rank lists them
        add_process_set(ps)


# What this build has, answered honestly: hora's data planes are its own (shared memory and TCP), not MPI, Gloo,
# NCCL, DDL, oneCCL or a CUDA/ROCm build; it runs under mpirun without using MPI.
def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    raise ValueError("Horovod MPI is not enabled; hora does not use MPI (it runs under mpirun without it).")


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


# -- tensors <-> arrays --------------------------------------------------------------------------------------------
def _numpy_dtype(t: torch.Tensor, what: str) -> np.dtype:
    dt = _NUMPY_OF.get(t.dtype)
    if dt is None:
        supported = ", ".join(str(d).replace("torch.", "") for d in _NUMPY_OF)
        raise _f.UnsupportedError(f"{what} does not support tensors of {t.dtype}; supported: {supported}")
    return dt


def _view(t: torch.Tensor) -> np.ndarray:
    """The numpy view of a contiguous CPU tensor's memory (no copy)."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _host(t: Any, what: str) -> tuple[torch.Tensor, np.ndarray]:
    """(contiguous CPU tensor, its numpy view) for ``t``; a copy only when ``t`` is not already both."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise _f.UnsupportedError(
            f"{what} does not take sparse tensors; use .to_dense() (or sparse_as_dense)"
        )
    _numpy_dtype(t, what)
    h = t.detach()
    if h.device.type != "cpu":
        h = h.to("cpu")
    if not h.is_contiguous():
        h = h.contiguous()
    if h.is_conj():
        h = h.resolve_conj()
    return h, _view(h)


def _tensor(arr: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing ``arr``'s memory."""
    if arr.dtype == _NUMPY_OF[torch.bfloat16]:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _like(t: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``result`` (on the CPU) moved to ``t``'s device."""
    return result if t.device == result.device else result.to(t.device)


# -- handles -------------------------------------------------------------------------------------------------------
_handle_map: dict[int, tuple[Any, Callable[[Any], Any]]] = {}
_handle_lock = threading.Lock()
_next_handle = itertools.count(1)


def _register(handle: Any, finish: Callable[[Any], Any]) -> int:
    with _handle_lock:
        h = next(_next_handle)
        _handle_map[h] = (handle, finish)
    return h


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished; ``synchronize`` then returns without waiting."""
    with _handle_lock:
        entry = _handle_map.get(handle)
    if entry is None:
        raise ValueError(f"poll: unknown handle {handle!r} (already synchronized, or not from this hora)")
    return bool(entry[0].done())


def synchronize(handle: int | Callable[[], Any]) -> Any:
    """Wait for the operation behind ``handle`` and return its output; raises the operation's error."""
    if callable(handle):  # sparse_allreduce_async's handle
        return handle()
    with _handle_lock:
        entry = _handle_map.get(handle)
    if entry is None:
        return None  # Horovod returns None for a handle it does not know (e.g. synchronized twice)
    try:
        result = entry[0].wait()
    finally:
        with _handle_lock:
            _handle_map.pop(handle, None)
    return entry[1](result)


def _into(tensor: torch.Tensor, host: torch.Tensor) -> Callable[[Any], torch.Tensor]:
    """What an in-place operation returns when done: ``tensor``, with the result copied in from ``host`` unless the
    engine wrote straight into it (a contiguous CPU tensor)."""
    direct = host.data_ptr() == tensor.data_ptr() and tensor.device.type == "cpu"

    def finish(_: Any) -> torch.Tensor:
        if not direct:
            with torch.no_grad():
                tensor.copy_(host)
        return tensor

    return finish


# -- allreduce -----------------------------------------------------------------------------------------------------
def _allreduce_async(
    tensor: torch.Tensor,
    output: torch.Tensor | None,
    average: bool | None,
    name: str | None,
    op: int | None,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    with _scope(process_set):
        what = "allreduce_" if output is None else "allreduce"
        host, arr = _host(tensor, what)
        if output is None:  # in place: the result goes into ``tensor`` (straight into it when it is host memory)
            handle = _f._allreduce(arr, average, name, op, prescale_factor, postscale_factor, inplace=True)
            return _register(handle, _into(tensor, host))
        out_host = torch.empty(host.shape, dtype=host.dtype)
        handle = _f._allreduce(
            arr, average, name, op, prescale_factor, postscale_factor, inplace=False, out=_view(out_host)
        )
        return _register(handle, lambda _: _like(tensor, out_host))


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing ``tensor`` over all ranks (default op Average); returns a handle for ``synchronize``."""
    return _allreduce_async(tensor, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place ``allreduce_async``: ``synchronize`` returns ``tensor``, holding the result."""
    return _allreduce_async(tensor, None, average, name, op, prescale_factor, postscale_factor, process_set)


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


def _grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    inplace: bool,
    average: bool | None,
    name: str | None,
    op: int | None,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    with _scope(process_set):
        tensors = list(tensors)
        what = "grouped_allreduce_" if inplace else "grouped_allreduce"
        hosts = [_host(t, what) for t in tensors]
        if inplace:
            handle = _f._grouped(
                [a for _, a in hosts], average, name, op, prescale_factor, postscale_factor, inplace=True
            )

            def finish(_: Any) -> list[torch.Tensor]:
                with torch.no_grad():
                    for t, (h, _a) in zip(tensors, hosts):
                        if h.data_ptr() != t.data_ptr() or t.device.type != "cpu":
                            t.copy_(h)
                return tensors

            return _register(handle, finish)
        outs = [torch.empty(h.shape, dtype=h.dtype) for h, _ in hosts]
        handle = _f._grouped(
            [a for _, a in hosts],
            average,
            name,
            op,
            prescale_factor,
            postscale_factor,
            inplace=False,
            outs=[_view(o) for o in outs],
        )
        return _register(handle, lambda _: [_like(t, o) for t, o in zip(tensors, outs)])


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing a list of tensors as one group (negotiated and fused together)."""
    return _grouped_allreduce_async(
        tensors, False, average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _grouped_allreduce_async(
        tensors, True, average, name, op, prescale_factor, postscale_factor, process_set
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


# -- allgather -----------------------------------------------------------------------------------------------------
def _to_torch(tensor: torch.Tensor) -> Callable[[np.ndarray], torch.Tensor]:
    return lambda arr: _like(tensor, _tensor(arr))


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (its length may differ per rank)."""
    with _scope(process_set):
        _, arr = _host(tensor, "allgather")
        return _register(_f.allgather_async(arr, name), _to_torch(tensor))


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


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None, op: int | None, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Start reducing a sparse COO tensor: its indices and values are allgathered (duplicate indices then add up
    when the result is coalesced). Returns a function that waits and returns the sparse result, as Horovod's does;
    ``synchronize`` also accepts it."""
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices_h = allgather_async(t._indices().t().contiguous(), f"{name}.indices" if name else None, process_set)
    values_h = allgather_async(t._values(), f"{name}.values" if name else None, process_set)

    def handle() -> torch.Tensor:
        values, indices = synchronize(values_h), synchronize(indices_h)
        if op is None or op == Average:
            values = values / (process_set.size() or 1)
        return torch.sparse_coo_tensor(indices.t(), values, t.size())

    return handle


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    with _scope(process_set):
        tensors = list(tensors)
        arrs = [_host(t, "grouped_allgather")[1] for t in tensors]
        handle = _f.grouped_allgather_async(arrs, name)
        return _register(handle, lambda res: [_like(t, _tensor(a)) for t, a in zip(tensors, res)])


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather every tensor of the list as one group."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# -- broadcast -----------------------------------------------------------------------------------------------------
def _broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None, inplace: bool, process_set: ProcessSet
) -> int:
    with _scope(process_set):
        host, arr = _host(tensor, "broadcast_" if inplace else "broadcast")
        if inplace:
            handle = _f.broadcast_async_(arr, _set_root(process_set, root_rank), name)
            return _register(handle, _into(tensor, host))
        return _register(_f.broadcast_async(arr, _set_root(process_set, root_rank), name), _to_torch(tensor))


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start copying ``root_rank``'s ``tensor`` to every rank (into a new tensor)."""
    return _broadcast_async(tensor, root_rank, name, False, process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _broadcast_async(tensor, root_rank, name, True, process_set)


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


# -- alltoall / reducescatter ----------------------------------------------------------------------------------------
def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``splits[r]`` rows of ``tensor`` to rank r (equal parts without ``splits``)."""
    with _scope(process_set):
        _, arr = _host(tensor, "alltoall")
        if isinstance(splits, torch.Tensor):
            splits = splits.detach().cpu().numpy()
        handle = _f.alltoall_async(arr, splits, name)

        def finish(res: tuple[np.ndarray, Any]) -> tuple[torch.Tensor, torch.Tensor]:
            out, received = res
            return _like(tensor, _tensor(out)), torch.as_tensor(np.asarray(received, np.int32))

        return _register(handle, finish)


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


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing ``tensor`` over ranks; rank r gets its share of dimension 0 (lower ranks take the rest)."""
    with _scope(process_set):
        _, arr = _host(tensor, "reducescatter")
        handle = _f.reducescatter_async(arr, op, name, prescale_factor, postscale_factor)
        return _register(handle, _to_torch(tensor))


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter with a gradient: the gradient is allgathered (and averaged when the op averaged)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        h = reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        return synchronize(h)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output, process_set=ctx.process_set)
        if ctx.op == Average:
            grad = grad / ctx.process_set.size()
        return grad, None, None, None, None, None


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


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    with _scope(process_set):
        tensors = list(tensors)
        arrs = [_host(t, "grouped_reducescatter")[1] for t in tensors]
        handle = _f.grouped_reducescatter_async(arrs, op, name, prescale_factor, postscale_factor)
        return _register(handle, lambda res: [_like(t, _tensor(a)) for t, a in zip(tensors, res)])


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
    h = grouped_reducescatter_async(
        [c for c, _ in pairs], name, op, process_set, prescale_factor, postscale_factor
    )
    return [compression.decompress(o, c) for o, (_, c) in zip(synchronize(h), pairs)]


# -- synchronisation and objects -------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank has called barrier()."""
    with _scope(process_set):
        _f.barrier()


def join(device: int = -1) -> int:
    """This rank has no more data: until every rank joined, it contributes zeros to the others' allreduces.
    Returns the rank that joined last. ``device`` is accepted for Horovod compatibility (no GPU data plane)."""
    return _f.join()


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """``root_rank``'s picklable ``obj`` on every rank (cloudpickle when installed)."""
    with _scope(process_set):
        return _f.broadcast_object(obj, _set_root(process_set, root_rank), name)


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    with _scope(process_set):
        return _f.allgather_object(obj, name)
