"""The asynchronous half of Horovod's torch API: every ``*_async`` collective, ``poll`` and ``synchronize``.

CPU tensors are handed to the engine without a copy where torch allows it (:mod:`hora.torch.bridge`): in-place
operations write straight into the tensor, and the outputs of the out-of-place operations are torch tensors the
engine writes into. Non-contiguous tensors are made contiguous first (in-place operations copy the result back).
CUDA tensors are staged through host memory and the results copied back to the tensor's device (there is no GPU
transport yet). Calls return an integer handle, as Horovod's do; ``synchronize(handle)`` returns the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hora import _frontend as _f
from hora._frontend import Average, ProcessSet, global_process_set
from hora.torch.bridge import finish_into, host_view, on_device_of, register, take, tensor_of, view

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


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished; ``synchronize`` then returns without waiting."""
    entry = take(handle, remove=False)
    if entry is None:
        raise ValueError(f"poll: unknown handle {handle!r} (already synchronized, or not from this hora)")
    return bool(entry[0].done())


def synchronize(handle: int | Callable[[], Any]) -> Any:
    """Wait for the operation behind ``handle`` and return its output; raises the operation's error."""
    if callable(handle):  # sparse_allreduce_async's handle
        return handle()
    entry = take(handle, remove=False)
    if entry is None:
        return None  # Horovod returns None for a handle it does not know (e.g. synchronized twice)
    try:
        result = entry[0].wait()
    finally:
        take(handle, remove=True)
    return entry[1](result)


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
    what = "allreduce_" if output is None else "allreduce"
    host, arr = host_view(tensor, what)
    args: dict[str, Any] = dict(
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )
    if output is None:  # in place: the result goes into ``tensor`` (straight into it when it is host memory)
        handle = _f.start_allreduce(arr, inplace=True, **args)
        return register(handle, finish_into(tensor, host))
    out_host = torch.empty(host.shape, dtype=host.dtype)
    handle = _f.start_allreduce(arr, inplace=False, out=view(out_host), **args)
    return register(handle, lambda _: on_device_of(tensor, out_host))


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
    tensors = list(tensors)
    what = "grouped_allreduce_" if inplace else "grouped_allreduce"
    hosts = [host_view(t, what) for t in tensors]
    arrs = [a for _, a in hosts]
    args: dict[str, Any] = dict(
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )
    if inplace:
        handle = _f.start_grouped_allreduce(arrs, inplace=True, **args)

        def finish(_: Any) -> list[torch.Tensor]:
            with torch.no_grad():
                for t, (h, _a) in zip(tensors, hosts):
                    if h.data_ptr() != t.data_ptr() or t.device.type != "cpu":
                        t.copy_(h)
            return tensors

        return register(handle, finish)
    outs = [torch.empty(h.shape, dtype=h.dtype) for h, _ in hosts]
    handle = _f.start_grouped_allreduce(arrs, inplace=False, outs=[view(o) for o in outs], **args)
    return register(handle, lambda _: [on_device_of(t, o) for t, o in zip(tensors, outs)])


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
    return _grouped_allreduce_async(tensors, False, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _grouped_allreduce_async(tensors, True, average, name, op, prescale_factor, postscale_factor, process_set)


def _to_torch(tensor: torch.Tensor) -> Callable[[np.ndarray], torch.Tensor]:
    return lambda arr: on_device_of(tensor, tensor_of(arr))


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (its length may differ per rank)."""
    _, arr = host_view(tensor, "allgather")
    return register(_f.allgather_async(arr, name, process_set), _to_torch(tensor))


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
    tensors = list(tensors)
    arrs = [host_view(t, "grouped_allgather")[1] for t in tensors]
    handle = _f.grouped_allgather_async(arrs, name, process_set)
    return register(handle, lambda res: [on_device_of(t, tensor_of(a)) for t, a in zip(tensors, res)])


def _broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None, inplace: bool, process_set: ProcessSet
) -> int:
    host, arr = host_view(tensor, "broadcast_" if inplace else "broadcast")
    if inplace:
        handle = _f.broadcast_async_(arr, root_rank, name, process_set)
        return register(handle, finish_into(tensor, host))
    return register(_f.broadcast_async(arr, root_rank, name, process_set), _to_torch(tensor))


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


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``splits[r]`` rows of ``tensor`` to rank r (equal parts without ``splits``)."""
    _, arr = host_view(tensor, "alltoall")
    if isinstance(splits, torch.Tensor):
        splits = splits.detach().cpu().numpy()
    handle = _f.alltoall_async(arr, splits, name, process_set)

    def finish(res: tuple[np.ndarray, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = res
        return on_device_of(tensor, tensor_of(out)), torch.as_tensor(np.asarray(received, np.int32))

    return register(handle, finish)


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing ``tensor`` over ranks; rank r gets its share of dimension 0 (lower ranks take the rest)."""
    _, arr = host_view(tensor, "reducescatter")
    handle = _f.reducescatter_async(arr, op, name, prescale_factor, postscale_factor, process_set)
    return register(handle, _to_torch(tensor))


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    tensors = list(tensors)
    arrs = [host_view(t, "grouped_reducescatter")[1] for t in tensors]
    handle = _f.grouped_reducescatter_async(arrs, op, name, prescale_factor, postscale_factor, process_set)
    return register(handle, lambda res: [on_device_of(t, tensor_of(a)) for t, a in zip(tensors, res)])
