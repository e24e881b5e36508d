"""Collectives that move data without reducing it: allgather (single and grouped), broadcast and alltoall, with
Horovod's names and arguments. ``root_rank`` is a global rank, also on a process set (as in Horovod)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hora._dtypes import DTYPE_NAMES
from hora._engine.handle import Entry, Handle
from hora._engine.messages import Kind, Request
from hora._engine.outputs import new_array
from hora._frontend.core import GroupHandle, as_array, as_inplace_array, blocking, submit
from hora._frontend.process_set import ProcessSet, global_process_set, group_of, root_index
from hora._runtime.group import Group

__all__ = [
    "allgather",
    "allgather_async",
    "alltoall",
    "alltoall_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather",
    "grouped_allgather_async",
    "start_broadcast",
]


# -- allgather -----------------------------------------------------------------------------------------------------
def _allgather_entry(tensor: Any, name: str) -> Entry:
    arr = as_array(tensor, "allgather")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return Entry(Request(Kind.ALLGATHER, name, DTYPE_NAMES[arr.dtype], arr.shape), arr)


def allgather_async(
    tensor: Any, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ per rank)."""
    group = group_of(process_set)
    entry = _allgather_entry(tensor, name if name is not None else group.auto_name("allgather"))
    submit(group, entry)
    return entry.handle


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = global_process_set) -> np.ndarray:
    return blocking(lambda: allgather_async(tensor, name, process_set))


def grouped_allgather_async(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> GroupHandle:
    """Start an allgather of every tensor in the list, submitted and negotiated together."""
    group = group_of(process_set)
    base = name if name is not None else group.auto_name("grouped_allgather")
    entries = [_allgather_entry(t, f"{base}.{i}") for i, t in enumerate(tensors)]
    submit(group, *entries)
    return GroupHandle([e.handle for e in entries])


def grouped_allgather(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> list[np.ndarray]:
    return blocking(lambda: grouped_allgather_async(tensors, name, process_set))


# -- broadcast -----------------------------------------------------------------------------------------------------
def start_broadcast(
    tensor: Any,
    root_rank: int,
    *,
    inplace: bool,
    out: np.ndarray | None = None,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start a broadcast from ``root_rank``; the result goes to ``out`` (``tensor`` itself when ``inplace``, a new
    array when neither)."""
    group = group_of(process_set)
    root = root_index(process_set, root_rank)
    arr = as_inplace_array(tensor, "broadcast_") if inplace else as_array(tensor, "broadcast")
    if not 0 <= root < group.size:
        raise ValueError(f"broadcast root_rank={root_rank} is out of range: there are {group.size} ranks")
    req = Request(
        Kind.BROADCAST,
        name if name is not None else group.auto_name("broadcast"),
        DTYPE_NAMES[arr.dtype],
        arr.shape,
        root=root,
    )
    if out is None:
        out = arr if inplace else new_array(arr.shape, arr.dtype)
        if not inplace and group.rank == root:
            np.copyto(out, arr)
    elif group.rank == root and out is not arr:
        out[...] = arr
    entry = Entry(req, arr, out)
    submit(group, entry)
    return entry.handle


def broadcast_async(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank (returns a new array)."""
    return start_broadcast(tensor, root_rank, inplace=False, name=name, process_set=process_set)


def broadcast_async_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Handle:
    """In-place :func:`broadcast_async`: ``tensor`` receives the root's values."""
    return start_broadcast(tensor, root_rank, inplace=True, name=name, process_set=process_set)


def broadcast(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> np.ndarray:
    return blocking(lambda: broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> np.ndarray:
    return blocking(lambda: broadcast_async_(tensor, root_rank, name, process_set))


# -- alltoall ------------------------------------------------------------------------------------------------------
def _splits(group: Group, arr: np.ndarray, splits: Any) -> list[int]:
    if splits is None:
        if arr.shape[0] % group.size:
            raise ValueError(
                f"alltoall without splits needs the first dimension ({arr.shape[0]}) to be divisible by "
                f"the number of ranks ({group.size}); pass splits=[rows for rank 0, rank 1, ...]"
            )
        return [arr.shape[0] // group.size] * group.size
    split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
    if len(split_list) != group.size or min(split_list, default=0) < 0:
        raise ValueError(
            f"alltoall splits {split_list} must have one non-negative entry per rank ({group.size}): the rows "
            "for rank 0, rank 1, ..."
        )
    if sum(split_list) > arr.shape[0]:  # a smaller sum sends the first rows only, as in Horovod
        raise ValueError(
            f"alltoall splits {split_list} sum to {sum(split_list)} rows, more than the first dimension of the "
            f"tensor ({arr.shape[0]}); pass splits whose sum is at most {arr.shape[0]}"
        )
    return split_list


def alltoall_async(
    tensor: Any, splits: Any = None, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Handle:
    """Start scattering slices of ``tensor``'s first dimension to every rank (``splits[r]`` rows to rank r; equal
    slices when ``splits`` is None) and gathering what every rank sends here. The handle's result is (rows
    received, rows from each rank)."""
    group = group_of(process_set)
    arr = as_array(tensor, "alltoall")
    if arr.ndim == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    split_list = _splits(group, arr, splits)
    arr = arr[: sum(split_list)]  # rows past the splits' sum are not sent (Horovod's behaviour)
    req = Request(
        Kind.ALLTOALL,
        name if name is not None else group.auto_name("alltoall"),
        DTYPE_NAMES[arr.dtype],
        arr.shape,
        splits=tuple(split_list),
    )
    entry = Entry(req, arr)
    submit(group, entry)
    return entry.handle


def alltoall(
    tensor: Any, splits: Any = None, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Any:
    """Returns the received rows, and — when ``splits`` is given — also how many rows came from each rank."""
    output, received = blocking(lambda: alltoall_async(tensor, splits, name, process_set))
    return (output, received) if splits is not None else output
