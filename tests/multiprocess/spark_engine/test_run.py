"""hora.spark.run on a Spark local-cluster[2,1,1024]: results and ranks, a raising task, a SIGKILLed executor, too
few slots; no rank's process outlives its stage."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import hora.spark
from hora.errors import ConfigError, RunError
from workers import elastic_fns, engines


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def _gone(pids) -> list[int]:
    """The pids still alive after up to 20 s (Spark kills a cancelled task's Python worker after a timeout)."""
    deadline = time.monotonic() + 20.0
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("n", [2, 1])
def test_results_come_back_in_rank_order(spark, n):
    out = hora.spark.run(engines.topology, args=("tag",), num_proc=n)
    assert [r["rank"] for r in out] == list(range(n))
    assert all(r["size"] == n and r["tag"] == "tag" for r in out)
    # local-cluster's executors share this machine: one host, every rank local
    assert [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in out] == [
        (i, n, 0, 1) for i in range(n)
    ]
    assert {r["sum"] for r in out} == {n * (n - 1) / 2}


def test_num_proc_defaults_to_the_default_parallelism_and_env_reaches_the_ranks(spark):
    out = hora.spark.run(lambda: os.environ["HORA_TEST_FLAVOUR"], env={"HORA_TEST_FLAVOUR": "mint"})
    assert out == ["mint"] * spark.defaultParallelism


def test_a_raising_task_names_the_rank_and_no_rank_outlives_the_stage(spark, tmp_path):
    with pytest.raises(RunError) as info:
        hora.spark.run(engines.fail_after_start, args=(str(tmp_path), 1), num_proc=2)
    message = str(info.value)
    assert message.startswith("rank 1 on ")
    assert "raised ValueError: rank 1 refuses" in message and "in fail_after_start" in message
    assert "Spark did not retry the stage" in message
    assert info.value.rank == 1
    assert _gone(engines.pids(tmp_path).values()) == []


def test_too_few_slots_is_a_clear_error(spark):
    deadline = time.monotonic() + 120
    while hora.spark.runner.slots(spark) < 2 and time.monotonic() < deadline:  # both executors registered
        time.sleep(0.1)
    with pytest.raises(ConfigError, match=r"needs 3 slots at once .* the cluster has 2"):
        hora.spark.run(engines.topology, num_proc=3, start_timeout=1)


def test_a_sigkilled_executor_fails_the_stage_naming_the_rank(spark, tmp_path):
    """Last in the module: the cluster replaces the executor, which takes a while."""

    def kill_rank_1_executor():
        engines.wait_for(tmp_path / "started.1")
        os.kill(elastic_fns.executor_above(engines.pids(tmp_path)[1]), signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1_executor)
    killer.start()
    try:
        with pytest.raises(RunError) as info:
            hora.spark.run(engines.allreduce_loop, args=(str(tmp_path), 100_000), num_proc=2)
    finally:
        killer.join()
    assert str(info.value).startswith("rank 1 (Spark executor "), str(info.value)
    assert "was lost: ExecutorLostFailure" in str(info.value)
    assert info.value.rank == 1
    assert _gone(engines.pids(tmp_path).values()) == []
