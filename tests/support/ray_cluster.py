"""Ray clusters on this machine for the tests (tests/multiprocess/ray_engine, the tuning trials on Ray): Ray's
processes get hora and the test workers, and a private temp dir that is removed afterwards; what to check that
nothing of Ray outlived a test."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import paths

__all__ = ["alive", "local_cluster", "processes_under", "ray_environment", "settle"]


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


@contextlib.contextmanager
def local_cluster(monkeypatch: pytest.MonkeyPatch, nodes: int = 2, num_cpus: int = 2) -> Iterator[Any]:
    """A Ray cluster on this machine (Ray's ``cluster_utils.Cluster``: a head and ``nodes - 1`` more raylets, each
    with ``num_cpus`` CPUs), its files in a private temp dir; afterwards nothing of Ray may be left running."""
    from ray.cluster_utils import Cluster

    tmp = ray_environment(monkeypatch)
    cluster = None
    try:
        node = {"num_cpus": num_cpus, "object_store_memory": 80 << 20}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "temp_dir": tmp})
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        left = settle(lambda: processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes outlived the cluster: {left}"
