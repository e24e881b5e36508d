"""Between MXNet NDArrays and the numpy arrays the engine works on.

A CPU NDArray's memory is handed to the engine as a numpy view without a copy: MXNet's C API gives the data
pointer (``MXNDArrayGetData``, which first converts a oneDNN-laid-out array to the default layout), and the view
keeps the NDArray alive. MXNet runs operators asynchronously, so a view is only taken after MXNet's engine has
finished writing the array (``wait_to_read``), and an array hora writes into after every pending read and write of
it has finished (``MXNDArrayWaitToWrite``). Outputs are fresh NDArrays that MXNet owns; the engine writes the
result straight into them, so nothing returned shares memory with hora's buffers or with the input.
Arrays on another device (a GPU build) are staged through a CPU copy; sparse arrays are refused.
"""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from hora.errors import UnsupportedError

__all__ = [
    "MX_BFLOAT16",
    "copy_back",
    "empty_like",
    "host",
    "numpy_dtype",
    "on_cpu",
    "read_view",
    "to_device_of",
    "write_view",
]

#: MXNet's bfloat16 is a structured dtype over uint16 (``mxnet.ndarray.ndarray.bfloat16``).
MX_BFLOAT16 = np.dtype([("bfloat16", np.uint16)])
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: Every dtype MXNet 1.9's NDArrays have (bfloat16 aside); hora carries them all.
_SUPPORTED = [
    np.dtype(t) for t in (np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_)
]
_CPU = ("cpu", "cpu_pinned", "cpu_shared")
_CPU_TYPES = (1, 3, 5)  # mx.Context.devstr2type of the above


def numpy_dtype(nd: Any, what: str) -> np.dtype:
    """The numpy dtype the engine carries ``nd``'s elements as; UnsupportedError for other dtypes."""
    dt = np.dtype(nd.dtype)
    if dt == MX_BFLOAT16:
        return _BFLOAT16
    if dt not in _SUPPORTED:
        names = ", ".join([d.name for d in _SUPPORTED] + ["bfloat16"])
        raise UnsupportedError(f"{what} does not support NDArrays of dtype {dt}; supported: {names}")
    return dt


def on_cpu(nd: Any) -> bool:
    """Whether ``nd``'s memory is host memory (``nd.context`` costs several µs more: it builds a Context)."""
    dev_type, dev_id = ctypes.c_int(), ctypes.c_int()
    check_call(_LIB.MXNDArrayGetContext(nd.handle, ctypes.byref(dev_type), ctypes.byref(dev_id)))
    return dev_type.value in _CPU_TYPES


def host(nd: Any, what: str) -> Any:
    """``nd`` itself when its memory is on the CPU, else a CPU copy of it; TypeError/UnsupportedError otherwise."""
    if not isinstance(nd, mx.nd.NDArray):
        raise TypeError(f"{what} takes an mxnet NDArray, got {type(nd).__name__}")
    if nd.stype != "default":
        raise UnsupportedError(f"{what} does not take sparse ({nd.stype}) NDArrays; use .tostype('default')")
    numpy_dtype(nd, what)
    return nd if on_cpu(nd) else nd.copyto(mx.cpu())


class _Memory:
    """An NDArray's memory as numpy's array interface; numpy keeps this (and so the NDArray) alive as the base."""

    def __init__(self, nd: Any, pointer: int, shape: tuple[int, ...], typestr: str) -> None:
        self.nd = nd
        self.__array_interface__ = {
            "data": (pointer, False),
            "shape": shape,
            "typestr": typestr,
            "version": 3,
        }


def _view(nd: Any) -> np.ndarray:
    dt = numpy_dtype(nd, "view")
    shape = tuple(nd.shape)
    if 0 in shape:
        return np.empty(shape, dt)
    pointer = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(nd.handle, ctypes.byref(pointer)))
    carrier = np.dtype(np.uint16) if dt == _BFLOAT16 else dt
    arr = np.asarray(_Memory(nd, int(pointer.value or 0), shape, carrier.str))
    return arr.view(_BFLOAT16) if dt == _BFLOAT16 else arr


def read_view(nd: Any) -> np.ndarray:
    """A numpy view of a CPU NDArray's values, once MXNet has finished computing them (no copy)."""
    nd.wait_to_read()
    return _view(nd)


def write_view(nd: Any) -> np.ndarray:
    """A numpy view hora may write into: every pending MXNet read and write of ``nd`` has finished (no copy)."""
    check_call(_LIB.MXNDArrayWaitToWrite(nd.handle))
    return _view(nd)


def empty_like(nd: Any, shape: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
    """A new CPU NDArray (of ``nd``'s kind: ``mx.nd`` or ``mx.np``; on ``nd``'s CPU context), for an output."""
    ctx = nd.context
    ctx = ctx if ctx.device_type in _CPU else mx.cpu()
    out = mx.nd.empty(
        nd.shape if shape is None else shape, ctx=ctx, dtype=nd.dtype if dtype is None else dtype
    )
    return out.as_np_ndarray() if isinstance(nd, mx.np.ndarray) else out


def to_device_of(nd: Any, result: Any) -> Any:
    """``result`` (on the CPU) on ``nd``'s context (a copy only when it is another one)."""
    return result if result.context == nd.context else result.copyto(nd.context)


def copy_back(nd: Any, host_nd: Any) -> Any:
    """``nd`` after an in-place collective ran on ``host_nd`` (its CPU copy, or ``nd`` itself)."""
    if host_nd is not nd:
        host_nd.copyto(nd)
    return nd
