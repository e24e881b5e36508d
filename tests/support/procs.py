"""Reading the process table the way the tests check for leftovers: the children of a process, with their states."""

from __future__ import annotations

from pathlib import Path


def child_states(pid: int) -> dict[int, bytes]:
    """pid -> state letter (``b"S"``, ``b"Z"``, ...) of every process whose parent is ``pid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            data = (entry / "stat").read_bytes()
        except OSError:
            continue
        state, ppid = data[data.rindex(b")") + 2 :].split()[:2]
        if int(ppid) == pid:
            found[int(entry.name)] = state
    return found
