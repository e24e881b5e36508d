"""One Spark ``local-cluster[2,1,1024]`` (a master, two workers of one core, real executor JVMs) for the Spark tests
of this directory."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from support import paths


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
    try:
        yield sc
    finally:
        sc.stop()
        pyspark.SparkContext._gateway.shutdown()  # type: ignore[union-attr]
        pyspark.SparkContext._gateway = None
        pyspark.SparkContext._jvm = None
        mp.undo()
        shutil.rmtree(tmp, ignore_errors=True)
