"""Horovod's collective API on MXNet NDArrays (``horovod/mxnet/mpi_ops.py``'s names, arguments and defaults).

Horovod pushes each collective into MXNet's asynchronous engine and returns at once; hora's calls return once the
collective has finished (the result is then ready to read). ``priority`` is accepted and ignored: hora executes
collectives in the order the ranks agree on. CPU NDArrays go to the engine without a copy
(:mod:`hora.mxnet.bridge`): in-place calls write straight into the NDArray, the others into a new NDArray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from hora import _frontend as _f
from hora._frontend import Average, ProcessSet, Sum, global_process_set
from hora._frontend.core import blocking
from hora.mxnet import bridge

__all__ = [
    "allgather",
    "allreduce",
    "allreduce_",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_reducescatter",
    "join",
    "reducescatter",
]


def _nd_of(nd: Any, arr: np.ndarray) -> Any:
    """A new NDArray (``nd``'s kind, on ``nd``'s device) holding ``arr``, an array the engine returned and nobody
    else holds. Zero-copy where MXNet can adopt numpy memory (DLPack), else one copy."""
    try:
        out = mx.nd.from_numpy(arr, zero_copy=True)
    except Exception:  # dtypes MXNet's DLPack import refuses (int8, bfloat16; MXNet raises several types): one copy
        out = bridge.empty_like(nd, shape=arr.shape)
        np.copyto(bridge.write_view(out), arr.view(bridge.numpy_dtype(out, "allgather")))
        return bridge.to_device_of(nd, out)
    if isinstance(nd, mx.np.ndarray):
        out = out.as_np_ndarray()
    return bridge.to_device_of(nd, out)


# -- allreduce -----------------------------------------------------------------------------------------------------
def allreduce(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    op: int | None = None,
) -> Any:
    """Reduce ``tensor`` over all ranks (default: average) and return the result as a new NDArray; ``tensor`` is
    not modified. ``op`` (Sum, Average, Min, Max, Product) replaces the deprecated ``average``."""
    host = bridge.host(tensor, "allreduce")
    out = bridge.empty_like(host)
    blocking(
        lambda: _f.start_allreduce(
            bridge.read_view(host),
            inplace=False,
            out=bridge.write_view(out),
            average=average,
            name=name,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )
    )
    return out if host is tensor else out.copyto(tensor.context)


def allreduce_(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    op: int | None = None,
) -> Any:
    """In-place allreduce: ``tensor`` holds the result when this returns (and is returned)."""
    host = bridge.host(tensor, "allreduce_")
    blocking(
        lambda: _f.start_allreduce(
            bridge.write_view(host),
            inplace=True,
            average=average,
            name=name,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )
    )
    return bridge.copy_back(tensor, host)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    op: int | None = None,
) -> list[Any]:
    """Reduce every NDArray of the list as one group (negotiated and fused together); returns new NDArrays."""
    if not tensors:
        return tensors  # type: ignore[return-value]
    hosts = [bridge.host(t, "grouped_allreduce") for t in tensors]
    outs = [bridge.empty_like(h) for h in hosts]
    blocking(
        lambda: _f.start_grouped_allreduce(
            [bridge.read_view(h) for h in hosts],
            inplace=False,
            outs=[bridge.write_view(o) for o in outs],
            average=average,
            name=name,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )
    )
    return [o if h is t else o.copyto(t.context) for t, h, o in zip(tensors, hosts, outs)]


def grouped_allreduce_(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    op: int | None = None,
) -> list[Any]:
    """In-place grouped allreduce: every NDArray of the list holds its result when this returns."""
    if not tensors:
        return tensors  # type: ignore[return-value]
    tensors = list(tensors)
    hosts = [bridge.host(t, "grouped_allreduce_") for t in tensors]
    blocking(
        lambda: _f.start_grouped_allreduce(
            [bridge.write_view(h) for h in hosts],
            inplace=True,
            average=average,
            name=name,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )
    )
    return [bridge.copy_back(t, h) for t, h in zip(tensors, hosts)]


# -- allgather -----------------------------------------------------------------------------------------------------
def allgather(
    tensor: Any, name: str | None = None, priority: int = 0, process_set: ProcessSet = global_process_set
) -> Any:
    """Every rank's ``tensor`` concatenated along the first dimension (which may differ per rank), a new NDArray."""
    host = bridge.host(tensor, "allgather")
    result = blocking(lambda: _f.allgather_async(bridge.read_view(host), name, process_set))
    return _nd_of(tensor, result)


def grouped_allgather(
    tensors: Sequence[Any], name: str | None = None, priority: int = 0, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """``allgather`` of every NDArray of the list, negotiated together."""
    hosts = [bridge.host(t, "grouped_allgather") for t in tensors]
    results = blocking(lambda: _f.grouped_allgather_async([bridge.read_view(h) for h in hosts], name, process_set))
    return [_nd_of(t, r) for t, r in zip(tensors, results)]


# -- broadcast -----------------------------------------------------------------------------------------------------
def broadcast(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    priority: int = 0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s ``tensor`` on every rank, as a new NDArray (``root_rank`` is a global rank)."""
    host = bridge.host(tensor, "broadcast")
    out = bridge.empty_like(host)
    blocking(
        lambda: _f.start_broadcast(
            bridge.read_view(host),
            root_rank,
            inplace=False,
            out=bridge.write_view(out),
            name=name,
            process_set=process_set,
        )
    )
    return out if host is tensor else out.copyto(tensor.context)


def broadcast_(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    priority: int = 0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """In-place broadcast: ``tensor`` holds ``root_rank``'s values when this returns (and is returned)."""
    host = bridge.host(tensor, "broadcast_")
    blocking(
        lambda: _f.start_broadcast(bridge.write_view(host), root_rank, inplace=True, name=name, process_set=process_set)
    )
    return bridge.copy_back(tensor, host)


# -- alltoall, reducescatter ---------------------------------------------------------------------------------------
def alltoall(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    priority: int = 0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Rows ``splits[r]`` of ``tensor`` go to rank r (equal parts when None); returns the rows this rank received
    and, when ``splits`` is given, how many came from each rank (an int32 NDArray).

    As in Horovod (horovod/mxnet/mpi_ops.py): ``splits`` that are not an NDArray become an int32 one (a float is
    truncated), an NDArray of splits must be 1-D int32, and bad splits or a first dimension that does not divide
    evenly raise ``MXNetError`` (Horovod's enqueue errors)."""
    host = bridge.host(tensor, "alltoall")
    if splits is not None:
        if not isinstance(splits, mx.nd.NDArray):
            splits = mx.nd.array(splits, ctx=mx.cpu(), dtype="int32")
        if splits.ndim > 1:
            raise MXNetError(f"alltoall expects a 1D splits tensor, got shape {splits.shape}")
        if splits.dtype != np.int32:
            raise MXNetError(
                f"alltoall expects splits to contain 32-bit integer elements, got {np.dtype(splits.dtype).name}; "
                "pass an int32 NDArray or a list of ints"
            )
        splits = splits.asnumpy()

    def start() -> Any:
        try:
            return _f.alltoall_async(bridge.read_view(host), splits, name, process_set)
        except ValueError as exc:  # the argument checks: Horovod's enqueue fails them with MXNetError
            raise MXNetError(str(exc)) from None

    output, received = blocking(start)
    out = _nd_of(tensor, output)
    if splits is None:
        return out
    return out, mx.nd.array(np.asarray(received, np.int32), ctx=mx.cpu(), dtype=np.int32)


def reducescatter(
    tensor: Any,
    op: int = Average,
    name: str | None = None,
    priority: int = 0,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reduce ``tensor`` over ranks and return this rank's share of the first dimension (lower ranks take the
    remainder), a new NDArray."""
    _scatter_op(op, "reducescatter")
    host = bridge.host(tensor, "reducescatter")
    result = blocking(
        lambda: _f.reducescatter_async(bridge.read_view(host), op, name, prescale_factor, postscale_factor, process_set)
    )
    return _nd_of(tensor, result)


def grouped_reducescatter(
    tensors: Sequence[Any],
    op: int = Average,
    name: str | None = None,
    priority: int = 0,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """``reducescatter`` of every NDArray of the list, negotiated together."""
    _scatter_op(op, "grouped_reducescatter")
    hosts = [bridge.host(t, "grouped_reducescatter") for t in tensors]
    results = blocking(
        lambda: _f.grouped_reducescatter_async(
            [bridge.read_view(h) for h in hosts], op, name, prescale_factor, postscale_factor, process_set
        )
    )
    return [_nd_of(t, r) for t, r in zip(tensors, results)]


def _scatter_op(op: int, what: str) -> None:
    if op not in (Average, Sum):
        raise ValueError(f"{what} takes op=Average or op=Sum (as Horovod's MXNet API), got op={op}")


# -- control -------------------------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank (of ``process_set``) has called barrier()."""
    _f.barrier(process_set)


def join() -> int:
    """This rank has no more data: until every rank has joined, it contributes zeros to the others' allreduces.
    Returns the rank that joined last."""
    return _f.join()
