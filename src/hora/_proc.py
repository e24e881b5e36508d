"""Process utilities every launcher shares: is a process alive, tying a child's life to its parent, signalling a
process group, and installing signal handlers for the length of a call."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "become_subreaper",
    "die_with_parent",
    "handle_signals",
    "kill_group",
    "parent_pid",
    "process_alive",
    "process_start_time",
    "set_parent_death_signal",
    "usable_cpus",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 first: state, parent pid, ...); OSError
    when it cannot be read."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # The command name (field 2) may contain spaces and parentheses; fields after it follow the last ')'.
    return data[data.rindex(b")") + 2 :].split()


def process_start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); 0 where unknown."""
    try:
        return int(_stat(pid)[19])
    except OSError:
        return 0


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (``/proc/PID/stat`` field 4); OSError when it is gone or unreadable."""
    return int(_stat(pid)[1])


def process_alive(pid: int, start_time: int) -> bool:
    """False when ``pid`` is gone, a zombie, or a different process that reused the pid."""
    try:
        fields = _stat(pid)
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    if fields[0] in (b"Z", b"X"):
        return False
    return not start_time or int(fields[19]) == start_time


def set_parent_death_signal(sig: int) -> None:
    """Ask the kernel to send this process ``sig`` when its parent dies (Linux PR_SET_PDEATHSIG; no-op elsewhere)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``): a daemon a
    child double-forks is reparented here, not to PID 1 (:mod:`hora._orphans`); False where the system cannot."""
    return _prctl is not None and _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent() -> None:
    """A ``preexec_fn`` for children that must not outlive their parent: SIGKILL when it dies. Runs in the forked
    child before exec, so it stays tiny."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def kill_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (a child started with ``start_new_session=True``): it and
    whatever it started. A group that is already gone, or not ours, is ignored."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextlib.contextmanager
def handle_signals(handler: Callable[[int, Any], Any], *signals: int) -> Iterator[bool]:
    """Install ``handler`` for ``signals`` while the block runs and restore the previous handlers after it.
    Python only lets the main thread install handlers: elsewhere this installs nothing and yields False. A signal
    this process ignores (SIG_IGN: a background command of a non-interactive shell gets SIGINT so) stays ignored,
    as Python itself leaves it: a Ctrl-C meant for the foreground must not stop a job started in the background."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {s: signal.signal(s, handler) for s in signals if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield True
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def usable_cpus() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
