"""One local Ray instance (``ray.init``) for the Ray tests of this directory, in a private temp dir."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from support import paths


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def ray_environment(monkeypatch: pytest.MonkeyPatch) -> str:
    """Give Ray's worker processes hora and the test workers (they inherit the driver's environment); a private
    temp dir (Ray's session files are large; removed afterwards)."""
    extra = [str(paths.SRC), str(paths.TESTS), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in extra if p))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    return tempfile.mkdtemp(prefix="hray-", dir="/tmp")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    tmp = ray_environment(mp)
    try:
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=100 << 20, _temp_dir=tmp)
        yield ray
    finally:
        ray.shutdown()
        mp.undo()
        shutil.rmtree(tmp, ignore_errors=True)
