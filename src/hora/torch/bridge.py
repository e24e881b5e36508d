"""Between torch tensors and the numpy arrays the engine works on, and Horovod's integer handles.

A contiguous CPU tensor's memory is viewed as a numpy array without a copy (bfloat16 through an int16 view); a
result array becomes a tensor that shares its memory. Anything else (non-contiguous, CUDA, conjugated) is staged
through a contiguous CPU copy first.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import torch

from hora.errors import UnsupportedError

__all__ = ["finish_into", "host_view", "numpy_dtype", "on_device_of", "register", "take", "tensor_of", "view"]

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


def numpy_dtype(t: torch.Tensor, what: str) -> np.dtype:
    """The numpy dtype the engine carries ``t``'s elements as; UnsupportedError for other dtypes."""
    dt = _NUMPY_OF.get(t.dtype)
    if dt is None:
        supported = ", ".join(str(d).replace("torch.", "") for d in _NUMPY_OF)
        raise UnsupportedError(f"{what} does not support tensors of {t.dtype}; supported: {supported}")
    return dt


def view(t: torch.Tensor) -> np.ndarray:
    """The numpy view of a contiguous CPU tensor's memory (no copy)."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def host_view(t: Any, what: str) -> tuple[torch.Tensor, np.ndarray]:
    """(contiguous CPU tensor, its numpy view) for ``t``; a copy only when ``t`` is not already both."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise UnsupportedError(f"{what} does not take sparse tensors; use .to_dense() (or sparse_as_dense)")
    numpy_dtype(t, what)
    h = t.detach()
    if h.device.type != "cpu":
        h = h.to("cpu")
    if not h.is_contiguous():
        h = h.contiguous()
    if h.is_conj():
        h = h.resolve_conj()
    return h, view(h)


def tensor_of(arr: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing ``arr``'s memory."""
    if arr.dtype == _NUMPY_OF[torch.bfloat16]:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def on_device_of(t: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``result`` (on the CPU) moved to ``t``'s device."""
    return result if t.device == result.device else result.to(t.device)


def finish_into(tensor: torch.Tensor, host: torch.Tensor) -> Callable[[Any], torch.Tensor]:
    """What an in-place operation returns when done: ``tensor``, with the result copied in from ``host`` unless the
    engine wrote straight into it (a contiguous CPU tensor)."""
    direct = host.data_ptr() == tensor.data_ptr() and tensor.device.type == "cpu"

    def finish(_: Any) -> torch.Tensor:
        if not direct:
            with torch.no_grad():
                tensor.copy_(host)
        return tensor

    return finish


# -- Horovod's integer handles ---------------------------------------------------------------------------------------
_handle_map: dict[int, tuple[Any, Callable[[Any], Any]]] = {}
_handle_lock = threading.Lock()
_next_handle = itertools.count(1)


def register(handle: Any, finish: Callable[[Any], Any]) -> int:
    """An integer handle for an engine handle; ``finish`` turns the engine's result into what synchronize returns."""
    with _handle_lock:
        h = next(_next_handle)
        _handle_map[h] = (handle, finish)
    return h


def take(handle: int, remove: bool) -> tuple[Any, Callable[[Any], Any]] | None:
    """The engine handle and finisher behind ``handle`` (removed from the table when ``remove``); None if unknown."""
    with _handle_lock:
        return _handle_map.pop(handle, None) if remove else _handle_map.get(handle)
