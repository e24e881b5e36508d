"""Ray clusters on this machine for the tests (tests/multiprocess/ray_engine, the tuning trials on Ray): Ray's
processes get hora and the test workers, and a private temp dir that is removed afterwards; what to check that
nothing of Ray outlived a test."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from support import paths

__all__ = ["alive", "processes_under", "ray_environment", "settle"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def ray_environment(monkeypatch: pytest.MonkeyPatch) -> str:
    """Give Ray's worker processes hora and the test workers (they inherit the driver's environment); a private
    temp dir for everything Ray writes (its session files are large; removed afterwards)."""
    extra = [str(paths.SRC), str(paths.TESTS), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in extra if p))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    tmp = tempfile.mkdtemp(prefix="hray-", dir="/tmp")
    os.mkdir(os.path.join(tmp, "ray"))
    monkeypatch.setenv("RAY_TMPDIR", tmp)  # Ray's own files outside the session dir (the cluster address)
    return tmp


def processes_under(directory: str) -> list[int]:
    """Processes whose command line names ``directory`` (Ray's daemons name their session dir)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if directory.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def settle(check, seconds: float = 15.0):
    """``check()`` until it returns something empty or ``seconds`` pass; its last result."""
    deadline = time.monotonic() + seconds
    while (left := check()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
