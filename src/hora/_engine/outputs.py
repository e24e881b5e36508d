"""New result arrays, recycling the memory of large ones the caller has dropped.

A large fresh array costs a page fault per 4 KiB page on first write (glibc serves allocations above its mmap
threshold, at most 32 MiB, with fresh mappings): a 64 MiB allgather result paid more for its faults than for its
copy. :func:`new_array` keeps the few most recent large buffers and hands one out again only once nothing refers to
it any more (its reference count says that no result, view or tensor made from it is alive), so a value hora
returns never shares memory with another live value, and a training loop that drops each step's result gets warm
memory back.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["RECYCLE_BYTES", "clear", "new_array"]

#: Arrays of at least this many bytes are recycled; smaller ones come from the allocator (whose heap reuses them).
RECYCLE_BYTES = 32 << 20
_KEEP = 4  # buffers kept at most
_pool: list[np.ndarray] = []
_lock = threading.Lock()


def new_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, like ``np.empty(shape, dtype)``."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < RECYCLE_BYTES:
        return np.empty(shape, dtype)
    with _lock:
        free = [i for i in range(len(_pool)) if _unused(i)]
        for i in free:
            if _pool[i].nbytes == nbytes:
                return _pool[i].view(dtype).reshape(shape)
        buf = np.empty(nbytes, np.uint8)
        if len(_pool) >= _KEEP and free:
            del _pool[free[0]]
        if len(_pool) < _KEEP:
            _pool.append(buf)
        return buf.view(dtype).reshape(shape)


def _unused(i: int) -> bool:
    # Two references: the pool's list and getrefcount's argument; every array, view or tensor made from the buffer
    # holds one more (numpy views refer to the buffer that owns the memory, torch.from_numpy to the array).
    return sys.getrefcount(_pool[i]) == 2


def clear() -> None:
    """Let the kept buffers go (at shutdown)."""
    with _lock:
        _pool.clear()
