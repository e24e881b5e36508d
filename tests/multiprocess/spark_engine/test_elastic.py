"""hora.spark.run_elastic on a Spark local-cluster[2,1,1024]: the workers run in long-lived Spark tasks, one per
executor; an executor SIGKILLed mid-job takes its worker away, the other goes on alone, and the task Spark starts
again on the replacement executor joins as a new host."""

from __future__ import annotations

import functools
import re

import pytest

pytest.importorskip("pyspark")

import hora.spark
from hora.errors import ConfigError, RunError
from workers import elastic_fns


def test_too_few_task_slots_is_a_clear_error(spark):
    with pytest.raises(ConfigError, match=r"timed out waiting for Spark tasks to start: [0-2] of the 3 tasks"):
        hora.spark.run_elastic(elastic_fns.train, num_proc=3, start_timeout=3)


def test_an_executor_lost_mid_job_the_other_goes_on_and_its_replacement_joins(spark, tmp_path, capsys):
    fn = functools.partial(elastic_fns.train_through_a_lost_executor, str(tmp_path), 3, 8, 2)
    results = hora.spark.run_elastic(fn, num_proc=2, min_num_proc=1, elastic_timeout=60)
    said = capsys.readouterr().err
    killed = (tmp_path / "killed").read_text().rsplit(":", 1)[0]  # the executor rank 1 ran on: <host>/exec-<id>
    assert "/exec-" in killed
    assert f"host {killed} is blacklisted" in said, said
    rounds = re.findall(r"round (\d+): (\d+) ranks on (.+)", said)
    assert len(rounds) >= 2 and all(size in ("1", "2") for _, size, _ in rounds), said
    last = rounds[-1][2].split(", ")
    assert len(last) == 2 and killed not in last  # a new executor took the lost one's place
    assert (tmp_path / "log").read_text().startswith("0 2\n")
    assert [r[:2] for r in results] == [(0, 2), (1, 2)] and len({r[2] for r in results}) == 1



def test_when_every_worker_fails_the_error_holds_their_tracebacks(spark):
    with pytest.raises(RunError) as info:
        hora.spark.run_elastic(elastic_fns.refuse, num_proc=2)
    message = str(info.value)
    assert "every worker of the last round (2) failed" in message
    assert "ValueError: worker of rank 0 refuses" in message and "in refuse" in message, message
    assert "pid" not in message.split("rank  :")[1].split("exit")[0]  # no pid of this machine to show
