"""Allreduce and reducescatter, single and grouped (Horovod's names and arguments).

Every collective takes ``process_set=`` (default: every rank). The ``start_*`` functions are the framework
adapters' entry points: they take where the results go (``out``/``outs``: the framework's own memory), so a
result is written once, straight into the tensor the adapter returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hora._engine.handle import Entry, Handle, Pieces
from hora._engine.messages import Kind
from hora._engine.outputs import new_array
from hora._frontend.core import (
    Average,
    GroupHandle,
    as_array,
    as_inplace_array,
    blocking,
    reduce_request,
    resolve_op,
    submit,
    synchronize,
)
from hora._frontend.process_set import ProcessSet, global_process_set, group_of
from hora._runtime.group import Group

__all__ = [
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "reducescatter",
    "reducescatter_async",
    "start_allreduce",
    "start_grouped_allreduce",
]


# -- allreduce -----------------------------------------------------------------------------------------------------
def start_allreduce(
    tensor: Any,
    *,
    inplace: bool,
    out: np.ndarray | None = None,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start an allreduce of ``tensor``; the result goes to ``out`` (``tensor`` itself when ``inplace``, a new
    array when neither)."""
    group = group_of(process_set)
    arr = as_inplace_array(tensor, "allreduce_") if inplace else as_array(tensor, "allreduce")
    req = reduce_request(Kind.ALLREDUCE, group, arr, name, resolve_op(average, op), prescale_factor, postscale_factor)
    if out is None:
        out = arr if inplace else new_array(arr.shape, arr.dtype)
    entry = Entry(req, arr, out)
    submit(group, entry)
    return entry.handle


def allreduce_async(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start reducing ``tensor`` across all ranks (default op: Average). Returns a handle for :func:`synchronize`."""
    return start_allreduce(
        tensor,
        inplace=False,
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )


def allreduce_async_(
    tensor: np.ndarray,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """In-place :func:`allreduce_async`: the result is written into ``tensor``."""
    return start_allreduce(
        tensor,
        inplace=True,
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )


def allreduce(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> np.ndarray:
    """Reduce ``tensor`` across all ranks and return the result (a new array)."""
    done = _express(tensor, False, average, name, op, prescale_factor, postscale_factor, process_set)
    if done is not None:
        return done
    return blocking(lambda: allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_(
    tensor: np.ndarray,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> np.ndarray:
    """Reduce ``tensor`` in place across all ranks; returns ``tensor``."""
    done = _express(tensor, True, average, name, op, prescale_factor, postscale_factor, process_set)
    if done is not None:
        return done
    return blocking(lambda: allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _express(
    tensor: Any,
    inplace: bool,
    average: bool | None,
    name: str | None,
    op: int | None,
    pre: float,
    post: float,
    process_set: ProcessSet | None,
) -> np.ndarray | None:
    """A blocking allreduce through the engine's express lane (:mod:`hora._engine.express`): the result, or None
    when the lane does not apply (the caller submits it as usual: same checks, same errors)."""
    if name is None or type(tensor) is not np.ndarray or not tensor.flags.c_contiguous:
        return None  # unnamed collectives are never cached; other inputs take the checked path
    if inplace and not tensor.flags.writeable:
        return None
    engine = group_of(process_set).engine
    out = tensor if inplace else new_array(tensor.shape, tensor.dtype)
    done = engine.express(name, tensor, out, int(resolve_op(average, op)), float(pre), float(post))
    if done is True:
        return out
    return None if done is False else synchronize(done.handle)


# -- grouped allreduce ---------------------------------------------------------------------------------------------
def start_grouped_allreduce(
    tensors: Sequence[Any],
    *,
    inplace: bool,
    outs: Sequence[np.ndarray] | None = None,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> GroupHandle:
    """Start reducing a list of tensors as one group (submitted together, negotiated together); results go to
    ``outs`` (the tensors themselves when ``inplace``, new arrays when neither)."""
    group = group_of(process_set)
    resolved = resolve_op(average, op)
    base = name if name is not None else group.auto_name("grouped_allreduce")
    what = "grouped_allreduce_" if inplace else "grouped_allreduce"
    arrs = [as_inplace_array(t, what) if inplace else as_array(t, what) for t in tensors]
    results = list(outs) if outs is not None else arrs if inplace else [new_array(a.shape, a.dtype) for a in arrs]
    if len(arrs) > 1 and all(a.dtype == arrs[0].dtype and a.size for a in arrs):
        # One request for the whole group: negotiated, cached and completed once, reduced as the concatenation
        # of the tensors (the engine cost per tensor is then a list item, not a request). Its name is the first
        # tensor's, so a rank that had to split the group (mixed dtypes) still meets it by name and gets a clear
        # mismatch instead of a stall.
        req = reduce_request(Kind.ALLREDUCE, group, arrs[0], f"{base}.0", resolved, prescale_factor, postscale_factor)
        sizes = tuple(a.size for a in arrs)
        req = dataclasses.replace(req, shape=(sum(sizes),), splits=sizes)
        pieces = Pieces([a.reshape(-1) for a in arrs], [o.reshape(-1) for o in results], results)
        entry = Entry(req, pieces=pieces)
        submit(group, entry)
        return GroupHandle([entry.handle], packed=True)
    entries = []
    for i, arr in enumerate(arrs):
        req = reduce_request(Kind.ALLREDUCE, group, arr, f"{base}.{i}", resolved, prescale_factor, postscale_factor)
        entries.append(Entry(req, arr, results[i]))
    submit(group, *entries)
    return GroupHandle([e.handle for e in entries])


def grouped_allreduce_async(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> GroupHandle:
    """Start reducing a list of tensors as one group (submitted together, negotiated together)."""
    return start_grouped_allreduce(
        tensors,
        inplace=False,
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )


def grouped_allreduce_async_(
    tensors: Sequence[np.ndarray],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> GroupHandle:
    """In-place :func:`grouped_allreduce_async`."""
    return start_grouped_allreduce(
        tensors,
        inplace=True,
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> list[np.ndarray]:
    return blocking(
        lambda: grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    )


def grouped_allreduce_(
    tensors: Sequence[np.ndarray],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> list[np.ndarray]:
    return blocking(
        lambda: grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    )


# -- reducescatter -------------------------------------------------------------------------------------------------
def _reducescatter_entry(
    group: Group, tensor: Any, name: str | None, op: Any, prescale: float, postscale: float, what: str
) -> Entry:
    arr = as_array(tensor, what)
    if arr.ndim == 0:  # Horovod refuses scalars too; checked here, so no rank sends anything
        raise ValueError(f"{what}: a 0-d tensor (scalar) cannot be scattered; it needs at least one dimension")
    return Entry(reduce_request(Kind.REDUCESCATTER, group, arr, name, op, prescale, postscale), arr)


def reducescatter_async(
    tensor: Any,
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start reducing ``tensor`` across ranks; rank r receives its share of the first dimension (lower ranks take
    the remainder)."""
    group = group_of(process_set)
    entry = _reducescatter_entry(
        group, tensor, name, resolve_op(None, op), prescale_factor, postscale_factor, "reducescatter"
    )
    submit(group, entry)
    return entry.handle


def reducescatter(
    tensor: Any,
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> np.ndarray:
    return blocking(lambda: reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set))


def grouped_reducescatter_async(
    tensors: Sequence[Any],
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> GroupHandle:
    """Start a reducescatter of every tensor in the list, submitted and negotiated together."""
    group = group_of(process_set)
    resolved = resolve_op(None, op)
    base = name if name is not None else group.auto_name("grouped_reducescatter")
    entries = [
        _reducescatter_entry(
            group, t, f"{base}.{i}", resolved, prescale_factor, postscale_factor, "grouped_reducescatter"
        )
        for i, t in enumerate(tensors)
    ]
    submit(group, *entries)
    return GroupHandle([e.handle for e in entries])


def grouped_reducescatter(
    tensors: Sequence[Any],
    op: int = Average,
    name: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> list[np.ndarray]:
    return blocking(
        lambda: grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor, process_set)
    )
