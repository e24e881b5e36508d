"""One local Ray instance (``ray.init``) for the Ray tests of this directory, in a private temp dir."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
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
        left = settle(lambda: processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes outlived ray.shutdown(): {left}"


@pytest.fixture(scope="module")
def two_nodes():
    """A 2-node Ray cluster on this machine (a head and a second raylet, 2 CPUs each: Ray's cluster_utils)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    mp = pytest.MonkeyPatch()
    tmp = ray_environment(mp)
    cluster = None
    try:
        node = {"num_cpus": 2, "object_store_memory": 80 << 20}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "temp_dir": tmp})
        cluster.add_node(**node)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        mp.undo()
        left = settle(lambda: processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes outlived the cluster: {left}"
