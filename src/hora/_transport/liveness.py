"""Is a peer process on this host still alive? (pid plus start time, so a recycled pid is not mistaken for it)."""

from __future__ import annotations

import os

__all__ = ["process_alive", "process_start_time"]


def process_start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    # The command name (field 2) may contain spaces and parentheses; fields after it follow the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[19])


def process_alive(pid: int, start_time: int) -> bool:
    """False when ``pid`` is gone, a zombie, or a different process that reused the pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
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
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return False
    return not start_time or int(fields[19]) == start_time
