"""Horovod's collective API on numpy arrays. Framework adapters convert their tensors and call these.

Every function goes through the engine: ``allreduce(x)`` is ``synchronize(allreduce_async(x))``.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hora._engine.handle import Entry, Handle
from hora._engine.messages import Kind, ReduceOp, Request
from hora._process_sets import SetContext
from hora._process_sets import active as _active
from hora._runtime.context import (
    Context,
    cross_rank,
    cross_size,
    current,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from hora._transport.base import DTYPE_NAMES, DTYPES
from hora.errors import HoraError

try:  # like Horovod, serialise objects with cloudpickle when it is there (lambdas, local classes)
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle

__all__ = [
    "Adasum",
    "Average",
    "GroupHandle",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "cross_rank",
    "cross_size",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class UnsupportedError(HoraError, ValueError):
    """An argument combination hora does not support (e.g. an unsupported dtype or op)."""


class GroupHandle:
    """The handle of a grouped collective: completes when every member does; its result is the list of results."""

    def __init__(self, handles: list[Handle]) -> None:
        self.handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self, timeout: float | None = None) -> list[Any]:
        return [h.wait(timeout) for h in self.handles]


AnyHandle = Handle | GroupHandle


def _array(tensor: Any, what: str) -> np.ndarray:
    arr = np.asarray(tensor)
    if arr.dtype not in DTYPE_NAMES:
        raise UnsupportedError(f"{what} does not support dtype {arr.dtype}; supported: {', '.join(DTYPES)}")
    return arr if arr.flags.c_contiguous else np.array(arr, order="C")


def _inplace(tensor: Any, what: str) -> np.ndarray:
    if not isinstance(tensor, np.ndarray) or not tensor.flags.c_contiguous or not tensor.flags.writeable:
        raise UnsupportedError(
            f"{what} works in place and needs a writeable C-contiguous numpy array; "
            "use the variant without the trailing underscore for other inputs"
        )
    return _array(tensor, what)


def _resolve_op(average: bool | None, op: int | None, default: ReduceOp = Average) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("pass either op or the deprecated average argument, not both")
    if op is None:
        op = default if average is None else (Average if average else Sum)
    op = ReduceOp(op)
    if op is ReduceOp.ADASUM:
        raise UnsupportedError("op=Adasum is not supported by hora yet; use Average or Sum")
    return op


def _reduce_request(
    kind: Kind,
    ctx: Context | SetContext,
    arr: np.ndarray,
    name: str | None,
    op: ReduceOp,
    prescale: float,
    postscale: float,
) -> Request:
    if arr.dtype == np.bool_ and (op is Average or prescale != 1.0 or postscale != 1.0):
        raise UnsupportedError(
            f"{kind.value} of a bool array supports Sum (or), Min (and), Max (or) and "
            "Product (and) without scale factors"
        )
    return Request(
        kind,
        name if name is not None else ctx.auto_name(kind.value),
        DTYPE_NAMES[arr.dtype],
        arr.shape,
        int(op),
        prescale=float(prescale),
        postscale=float(postscale),
    )


_local = threading.local()


def _submit(ctx: Context | SetContext, *entries: Entry) -> None:
    # A blocking call is about to wait, and the waiting thread runs the engine itself: waking the engine thread
    # would only make it compete for the same cycle (a pipe write plus a context switch, tens of µs).
    ctx.engine.enqueue(entries, wake=not getattr(_local, "blocking", False))


def _now(start: Callable[[], AnyHandle]) -> Any:
    """Start a collective and wait for it (the blocking API)."""
    _local.blocking = True
    try:
        handle = start()
    finally:
        _local.blocking = False
    return synchronize(handle)


# -- allreduce -----------------------------------------------------------------------------------------------------
def _allreduce(
    tensor: Any,
    average: bool | None,
    name: str | None,
    op: int | None,
    prescale: float,
    postscale: float,
    inplace: bool,
    out: np.ndarray | None = None,
) -> Handle:
    """``out``: where the result goes (adapters pass their framework's memory); a new array when None."""
    ctx = _active()
    arr = _inplace(tensor, "allreduce_") if inplace else _array(tensor, "allreduce")
    req = _reduce_request(Kind.ALLREDUCE, ctx, arr, name, _resolve_op(average, op), prescale, postscale)
    if out is None:
        out = arr if inplace else np.empty_like(arr)
    entry = Entry(req, arr, out)
    _submit(ctx, entry)
    return entry.handle


def allreduce_async(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start reducing ``tensor`` across all ranks (default op: Average). Returns a handle for :func:`synchronize`."""
    return _allreduce(tensor, average, name, op, prescale_factor, postscale_factor, inplace=False)


def allreduce_async_(
    tensor: np.ndarray,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """In-place :func:`allreduce_async`: the result is written into ``tensor``."""
    return _allreduce(tensor, average, name, op, prescale_factor, postscale_factor, inplace=True)


def allreduce(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Reduce ``tensor`` across all ranks and return the result (a new array)."""
    return _now(lambda: allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor))


def allreduce_(
    tensor: np.ndarray,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Reduce ``tensor`` in place across all ranks; returns ``tensor``."""
    return _now(lambda: allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def _grouped(
    tensors: Sequence[Any],
    average: bool | None,
    name: str | None,
    op: int | None,
    prescale: float,
    postscale: float,
    inplace: bool,
    outs: Sequence[np.ndarray] | None = None,
) -> GroupHandle:
    ctx = _active()
    resolved = _resolve_op(average, op)
    base = name if name is not None else ctx.auto_name("grouped_allreduce")
    entries = []
    for i, t in enumerate(tensors):
        arr = _inplace(t, "grouped_allreduce_") if inplace else _array(t, "grouped_allreduce")
        req = _reduce_request(Kind.ALLREDUCE, ctx, arr, f"{base}.{i}", resolved, prescale, postscale)
        out = outs[i] if outs is not None else arr if inplace else np.empty_like(arr)
        entries.append(Entry(req, arr, out))
    _submit(ctx, *entries)
    return GroupHandle([e.handle for e in entries])


def grouped_allreduce_async(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> GroupHandle:
    """Start reducing a list of tensors as one group (submitted together, negotiated together)."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, inplace=False)


def grouped_allreduce_async_(
    tensors: Sequence[np.ndarray],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> GroupHandle:
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, inplace=True)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[np.ndarray]:
    return _now(
        lambda: grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor)
    )


def grouped_allreduce_(
    tensors: Sequence[np.ndarray],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[np.ndarray]:
    return _now(
        lambda: grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor)
    )


# -- allgather / broadcast / alltoall / reducescatter -------------------------------------------------------------------
def _allgather_entry(ctx: Context | SetContext, tensor: Any, name: str) -> Entry:
    arr = _array(tensor, "allgather")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return Entry(Request(Kind.ALLGATHER, name, DTYPE_NAMES[arr.dtype], arr.shape), arr)


def allgather_async(tensor: Any, name: str | None = None) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ per rank)."""
    ctx = _active()
    entry = _allgather_entry(ctx, tensor, name if name is not None else ctx.auto_name("allgather"))
    _submit(ctx, entry)
    return entry.handle


def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None) -> GroupHandle:
    """Start an allgather of every tensor in the list, submitted and negotiated together."""
    ctx = _active()
    base = name if name is not None else ctx.auto_name("grouped_allgather")
    entries = [_allgather_entry(ctx, t, f"{base}.{i}") for i, t in enumerate(tensors)]
    _submit(ctx, *entries)
    return GroupHandle([e.handle for e in entries])


def grouped_allgather(tensors: Sequence[Any], name: str | None = None) -> list[np.ndarray]:
    return _now(lambda: grouped_allgather_async(tensors, name))


def allgather(tensor: Any, name: str | None = None) -> np.ndarray:
    return _now(lambda: allgather_async(tensor, name))


def _broadcast(tensor: Any, root_rank: int, name: str | None, inplace: bool) -> Handle:
    ctx = _active()
    arr = _inplace(tensor, "broadcast_") if inplace else _array(tensor, "broadcast")
    if not 0 <= int(root_rank) < ctx.size:
        raise ValueError(f"broadcast root_rank={root_rank} is out of range: there are {ctx.size} ranks")
    req = Request(
        Kind.BROADCAST,
        name if name is not None else ctx.auto_name("broadcast"),
        DTYPE_NAMES[arr.dtype],
        arr.shape,
        root=int(root_rank),
    )
    out = arr if inplace else (arr.copy() if ctx.rank == root_rank else np.empty_like(arr))
    entry = Entry(req, arr, out)
    _submit(ctx, entry)
    return entry.handle


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank (returns a new array)."""
    return _broadcast(tensor, root_rank, name, inplace=False)


def broadcast_async_(tensor: np.ndarray, root_rank: int, name: str | None = None) -> Handle:
    return _broadcast(tensor, root_rank, name, inplace=True)


def broadcast(tensor: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    return _now(lambda: broadcast_async(tensor, root_rank, name))


def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None) -> np.ndarray:
    return _now(lambda: broadcast_async_(tensor, root_rank, name))


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None) -> Handle:
    """Start scattering slices of ``tensor``'s first dimension to every rank (``splits[r]`` rows to rank r; equal
    slices when ``splits`` is None) and gathering what every rank sends here."""
    ctx = _active()
    arr = _array(tensor, "alltoall")
    if arr.ndim == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        if arr.shape[0] % ctx.size:
            raise ValueError(
                f"alltoall without splits needs the first dimension ({arr.shape[0]}) to be divisible by "
                f"the number of ranks ({ctx.size}); pass splits=[rows for rank 0, rank 1, ...]"
            )
        split_list = [arr.shape[0] // ctx.size] * ctx.size
    else:
        split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        if len(split_list) != ctx.size or min(split_list, default=0) < 0 or sum(split_list) != arr.shape[0]:
            raise ValueError(
                f"alltoall splits {split_list} must have one non-negative entry per rank ({ctx.size}) "
                f"summing to the first dimension ({arr.shape[0]})"
            )
    req = Request(
        Kind.ALLTOALL,
        name if name is not None else ctx.auto_name("alltoall"),
        DTYPE_NAMES[arr.dtype],
        arr.shape,
        splits=tuple(split_list),
    )
    entry = Entry(req, arr)
    _submit(ctx, entry)
    return entry.handle


def alltoall(tensor: Any, splits: Any = None, name: str | None = None) -> Any:
    """Returns the received rows, and — when ``splits`` is given — also how many rows came from each rank."""
    handle = alltoall_async(tensor, splits, name)
    output, received = synchronize(handle)
    return (output, received) if splits is not None else output


def reducescatter_async(
    tensor: Any,
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start reducing ``tensor`` across ranks; rank r receives its share of the first dimension (lower ranks take
    the remainder)."""
    ctx = _active()
    entry = _reducescatter_entry(ctx, tensor, name, _resolve_op(None, op), prescale_factor, postscale_factor)
    _submit(ctx, entry)
    return entry.handle


def _reducescatter_entry(
    ctx: Context | SetContext, tensor: Any, name: str | None, op: ReduceOp, prescale: float, postscale: float
) -> Entry:
    arr = _array(tensor, "reducescatter")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return Entry(_reduce_request(Kind.REDUCESCATTER, ctx, arr, name, op, prescale, postscale), arr)


def grouped_reducescatter_async(
    tensors: Sequence[Any],
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> GroupHandle:
    """Start a reducescatter of every tensor in the list, submitted and negotiated together."""
    ctx = _active()
    resolved = _resolve_op(None, op)
    base = name if name is not None else ctx.auto_name("grouped_reducescatter")
    entries = [
        _reducescatter_entry(ctx, t, f"{base}.{i}", resolved, prescale_factor, postscale_factor)
        for i, t in enumerate(tensors)
    ]
    _submit(ctx, *entries)
    return GroupHandle([e.handle for e in entries])


def grouped_reducescatter(
    tensors: Sequence[Any],
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[np.ndarray]:
    return _now(lambda: grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor))


def reducescatter(
    tensor: Any,
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    return _now(lambda: reducescatter_async(tensor, op, name, prescale_factor, postscale_factor))


# -- synchronisation ---------------------------------------------------------------------------------------------------
def poll(handle: AnyHandle) -> bool:
    """True when the collective behind ``handle`` has finished (successfully or not)."""
    return handle.done()


def synchronize(handle: AnyHandle, timeout: float | None = None) -> Any:
    """Wait for ``handle`` and return its result; raises the collective's error (e.g. MismatchError)."""
    return handle.wait(timeout)


BARRIER_NAME = "hora.barrier"
_BARRIER_LOCK = threading.Lock()


def barrier() -> None:
    """Block until every rank has called barrier()."""
    ctx = _active()
    # One name for every barrier, so that after the first one it is answered from the response cache: agreed in
    # the shared-memory exchange, which releases all ranks together (a coordinator round releases rank 0 first).
    # Threads of one rank take turns: the n-th barrier of each rank pairs with the n-th of the others.
    with _BARRIER_LOCK:
        entry = Entry(Request(Kind.BARRIER, BARRIER_NAME))
        ctx.engine.enqueue([entry], wake=False)  # this thread waits, and runs the engine while it does
        entry.handle.wait()


def join() -> int:
    """Signal that this rank has no more data. Until every rank has joined, this rank contributes zeros to the
    allreduces the others still run. Returns the rank that joined last."""
    ctx = current()
    entry = Entry(Request(Kind.JOIN, "join"))
    ctx.engine.enqueue([entry], wake=False)
    return int(entry.handle.wait())


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline of every collective to ``file_path`` (rank 0 writes it). Replaces a
    timeline that is already being written. Same as setting HORA_TIMELINE (HOROVOD_TIMELINE) before init()."""
    current().engine.start_timeline(os.path.abspath(file_path), mark_cycles)


def stop_timeline() -> None:
    """Stop writing the timeline and close its file (which stays valid JSON)."""
    current().engine.stop_timeline()


# -- objects ------------------------------------------------------------------------------------------------------------
def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Send a picklable object from ``root_rank`` to every rank; returns it everywhere."""
    ctx = _active()
    base = name if name is not None else ctx.auto_name("broadcast_object")
    if ctx.rank == root_rank:
        payload = np.frombuffer(_pickler.dumps(obj), np.uint8)
        length = np.array([payload.size], np.int64)
    else:
        payload, length = np.empty(0, np.uint8), np.zeros(1, np.int64)
    broadcast_(length, root_rank, f"{base}.size")
    if ctx.rank != root_rank:
        payload = np.empty(int(length[0]), np.uint8)
    data = broadcast(payload, root_rank, f"{base}.data")
    return obj if ctx.rank == root_rank else pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Gather a picklable object from every rank; returns the list in rank order."""
    ctx = _active()
    base = name if name is not None else ctx.auto_name("allgather_object")
    payload = np.frombuffer(_pickler.dumps(obj), np.uint8)
    sizes = allgather(np.array([payload.size], np.int64), f"{base}.size")
    data = allgather(payload, f"{base}.data")
    out, pos = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[pos : pos + n].tobytes()))
        pos += n
    return out
