"""What every frontend collective shares: the reduce ops, argument checks, submitting entries to a group's engine,
the blocking form of a call, and waiting for handles."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from hora._dtypes import DTYPE_NAMES, DTYPES, ReduceOp
from hora._engine.adasum import ADASUM_DTYPES
from hora._engine.handle import Entry, Handle
from hora._engine.messages import Kind, Request
from hora._runtime.group import Group
from hora.errors import UnsupportedError

__all__ = [
    "Adasum",
    "AnyHandle",
    "Average",
    "GroupHandle",
    "Max",
    "Min",
    "Product",
    "Sum",
    "as_array",
    "as_inplace_array",
    "blocking",
    "check_adasum",
    "poll",
    "reduce_request",
    "resolve_op",
    "submit",
    "synchronize",
]

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class GroupHandle:
    """The handle of a grouped collective: completes when every member does; its result is the list of results."""

    def __init__(self, handles: list[Handle], packed: bool = False) -> None:
        self.handles = handles
        self._packed = packed  # one handle whose result is already the list (a grouped request)

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self, timeout: float | None = None) -> list[Any]:
        if self._packed:
            return list(self.handles[0].wait(timeout))
        return [h.wait(timeout) for h in self.handles]


AnyHandle = Handle | GroupHandle


def as_array(tensor: Any, what: str) -> np.ndarray:
    """``tensor`` as a C-contiguous array of a supported dtype (a view when it already is one)."""
    arr = np.asarray(tensor)
    if arr.dtype not in DTYPE_NAMES:
        raise UnsupportedError(f"{what} does not support dtype {arr.dtype}; supported: {', '.join(DTYPES)}")
    return arr if arr.flags.c_contiguous else np.array(arr, order="C")


def as_inplace_array(tensor: Any, what: str) -> np.ndarray:
    """``tensor`` itself, checked to be an array an in-place collective can write into."""
    if not isinstance(tensor, np.ndarray) or not tensor.flags.c_contiguous or not tensor.flags.writeable:
        raise UnsupportedError(
            f"{what} works in place and needs a writeable C-contiguous numpy array; "
            "use the variant without the trailing underscore for other inputs"
        )
    return as_array(tensor, what)


def resolve_op(average: bool | None, op: int | None, default: ReduceOp = Average) -> ReduceOp:
    """The reduce op from Horovod's ``op`` or its deprecated ``average`` argument."""
    if average is not None and op is not None:
        raise ValueError("pass either op or the deprecated average argument, not both")
    if op is None:
        op = default if average is None else (Average if average else Sum)
    return ReduceOp(op)


def check_adasum(kind: Kind, group: Group, dtype: np.dtype) -> None:
    """What Horovod's Adasum takes (its messages): an allreduce of float16/32/64 over all ranks, a power of two."""
    if kind is not Kind.ALLREDUCE:
        raise UnsupportedError(f"{kind.value} does not support op=Adasum; Adasum is an allreduce (use Sum or Average)")
    if group.set_id != 0:
        raise UnsupportedError("Adasum does not support non-global process sets yet.")
    if group.size & (group.size - 1):
        raise UnsupportedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    if dtype not in ADASUM_DTYPES:
        raise UnsupportedError(f"op=Adasum reduces float16, float32 and float64 tensors, not {dtype}")


def reduce_request(
    kind: Kind, group: Group, arr: np.ndarray, name: str | None, op: ReduceOp, prescale: float, postscale: float
) -> Request:
    if op is ReduceOp.ADASUM:
        check_adasum(kind, group, arr.dtype)
    if arr.dtype == np.bool_ and (op is Average or prescale != 1.0 or postscale != 1.0):
        raise UnsupportedError(
            f"{kind.value} of a bool array supports Sum (or), Min (and), Max (or) and "
            "Product (and) without scale factors"
        )
    return Request(
        kind,
        name if name is not None else group.auto_name(kind.value),
        DTYPE_NAMES[arr.dtype],
        arr.shape,
        int(op),
        prescale=float(prescale),
        postscale=float(postscale),
    )


_local = threading.local()


def submit(group: Group, *entries: Entry) -> None:
    """Hand ``entries`` to the group's engine, atomically."""
    # A blocking call is about to wait, and the waiting thread runs the engine itself: waking the engine thread
    # would only make it compete for the same cycle (a pipe write plus a context switch, tens of µs).
    group.engine.enqueue(entries, wake=not getattr(_local, "blocking", False))


def blocking(start: Callable[[], AnyHandle]) -> Any:
    """Start a collective and wait for it (the blocking API)."""
    _local.blocking = True
    try:
        handle = start()
    finally:
        _local.blocking = False
    return synchronize(handle)


def poll(handle: AnyHandle) -> bool:
    """True when the collective behind ``handle`` has finished (successfully or not)."""
    return handle.done()


def synchronize(handle: AnyHandle, timeout: float | None = None) -> Any:
    """Wait for ``handle`` and return its result; raises the collective's error (e.g. MismatchError)."""
    return handle.wait(timeout)
