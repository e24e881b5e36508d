"""Blocking waits on a 32-bit word in shared memory: Linux's futex(2), process-shared, through ctypes.

A waiter that has nothing better to do than wait for a peer sleeps in the kernel until the peer writes the word
and wakes it, so a busy machine gives the peer the core at once instead of sharing it with a sleep-polling loop.
ctypes releases the GIL for the call. Where the syscall is missing (not Linux), :data:`AVAILABLE` is False and
:func:`wait` sleeps briefly instead, so callers work everywhere and block properly where they can.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time
from typing import Any

__all__ = ["AVAILABLE", "wait", "wake"]

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # not the _PRIVATE variants: the word is shared between processes
_WAKE_ALL = 2**31 - 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "i686": 240, "i386": 240, "armv7l": 240, "ppc64le": 221, "s390x": 238}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall(keep_gil: bool) -> Any:
    if not sys.platform.startswith("linux") or platform.machine() not in _SYS_FUTEX:
        return None
    try:
        fn = (ctypes.PyDLL(None) if keep_gil else ctypes.CDLL(None, use_errno=True)).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


# A wait releases the GIL (it may sleep); a wake keeps it: it never blocks, and handing the GIL back and forth
# around a microsecond syscall can cost the caller a whole switch interval when another thread wants the GIL.
_syscall_fn = _syscall(keep_gil=False)
_wake_fn = _syscall(keep_gil=True)
_NR = _SYS_FUTEX.get(platform.machine(), -1)
AVAILABLE = _syscall_fn is not None


def wake(address: int) -> None:
    """Wake every process waiting on the word at ``address``."""
    if _wake_fn is not None:
        _wake_fn(_NR, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)


def wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the 32-bit word at ``address`` holds ``expected`` (as unsigned), until woken, a signal, or
    ``timeout`` seconds. Returns at once when the word holds another value; the caller re-checks its condition."""
    if _syscall_fn is None:
        time.sleep(min(timeout, 1e-4))
        return
    ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
    r = _syscall_fn(
        _NR,
        ctypes.c_void_p(address),
        _FUTEX_WAIT,
        ctypes.c_uint32(expected & 0xFFFFFFFF),
        ctypes.byref(ts),
        None,
        0,
    )
    if r == -1 and ctypes.get_errno() not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
        raise OSError(ctypes.get_errno(), "futex wait failed")
