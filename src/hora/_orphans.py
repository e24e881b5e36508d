"""Processes a job's scripts leave behind: a daemon double-forked with ``setsid`` escapes the rank's process group
and, orphaned, would be reparented to PID 1 and live on after the job. The process that runs a job's ranks (the
``hora run`` command, each ``hora job`` host) becomes their *subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): orphans
below it are reparented to it instead, and when its own work is done every child it still has is one of them —
:func:`end_adopted` ends them (SIGTERM, then SIGKILL) and says which they were.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from hora._proc import parent_pid

__all__ = ["end_adopted"]

def _children() -> list[int]:
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if parent_pid(int(entry.name)) == me:
                out.append(int(entry.name))
    return out


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"{pid} ({cmd[:80] or '?'})"


def _reap(pids: list[int]) -> list[int]:
    """Collect the exited among ``pids``; those still running."""
    running = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if not done:
            running.append(pid)
    return running


def end_adopted(grace: float = 2.0, rounds: int = 5) -> list[str]:
    """End every child this process still has (all of them adopted orphans, once its own are done): SIGTERM, then
    SIGKILL after ``grace`` seconds; what they were, for the log. An adopted process's own children are adopted in
    turn when it dies, hence a few rounds."""
    ended: list[str] = []
    for _ in range(rounds):
        kids = _reap(_children())
        if not kids:
            break
        ended += [_describe(pid) for pid in kids]
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while (kids := _reap(kids)) and time.monotonic() < end:
            time.sleep(0.02)
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return ended
