"""One Spark ``local-cluster[2,1,1024]`` (a master, two workers of one core, real executor JVMs) for the Spark tests
of this directory; at the end the driver JVM and every executor it started must be gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import paths


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def descendants(root: int) -> list[int]:
    """Every live process below ``root``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            while pid > 1:
                pid = _parent(pid)
                if pid == root:
                    out.append(int(entry.name))
                    break
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.fixture(scope="module")
def spark():
    pyspark = pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (java on PATH)")
    tmp = tempfile.mkdtemp(prefix="hspark-", dir="/tmp")
    path = os.pathsep.join(p for p in [str(paths.SRC), str(paths.TESTS), os.environ.get("PYTHONPATH", "")] if p)
    conf = (
        pyspark.SparkConf()
        .setMaster("local-cluster[2,1,1024]")
        .setAppName("hora-tests")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.memory", "512m")
        .set("spark.local.dir", tmp)
        .set("spark.executorEnv.PYTHONPATH", path)
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", path)
    sc = pyspark.SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    gateway = pyspark.SparkContext._gateway
    jvm = getattr(gateway, "proc", None)  # the driver JVM (spark-submit) this fixture started
    try:
        yield sc
    finally:
        started = descendants(jvm.pid) if jvm is not None else []  # executors, their Python daemons and workers
        sc.stop()
        gateway.shutdown()
        pyspark.SparkContext._gateway = None
        pyspark.SparkContext._jvm = None
        if jvm is not None:
            jvm.stdin.close()  # the driver JVM ends when its stdin closes
            try:
                jvm.wait(timeout=30)
            except subprocess.TimeoutExpired:
                jvm.kill()
                jvm.wait()
        mp.undo()
        deadline = time.monotonic() + 30
        while (left := [p for p in started if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Spark processes outlived the cluster: {left}"
