"""The pure parts of hora.ray and hora.spark: host names from Ray's placement, rank order, reading Spark's failure
text, and which of run_elastic's tasks are alive (no Ray or Spark needed)."""

from __future__ import annotations

import json

from hora._runtime.rendezvous import RendezvousServer
from hora.ray.executor import _host_order, host_names
from hora.ray.worker import NodeInfo
from hora.spark.elastic import LOST_AFTER, SparkTaskDiscovery
from hora.spark.runner import _stage_error
from hora.spark.task import FAILURE_BEGIN, FAILURE_END


def _node(node_id: str, ip: str) -> NodeInfo:
    return NodeInfo(node_id, ip, "h", 1, 2)


def test_ranks_are_numbered_node_by_node_in_order_of_each_nodes_first_bundle():
    infos = [_node("B", "10.0.0.2"), _node("A", "10.0.0.1"), _node("B", "10.0.0.2"), _node("A", "10.0.0.1")]
    assert _host_order(infos) == [0, 2, 1, 3]


def test_host_names_are_ips_unless_several_ray_nodes_share_one():
    assert host_names([_node("A", "10.0.0.1"), _node("B", "10.0.0.2")]) == ["10.0.0.1", "10.0.0.2"]
    shared = host_names([_node("aaaaaaaaaaaaaaaa", "10.0.0.1"), _node("bbbbbbbbbbbbbbbb", "10.0.0.1")])
    assert shared == ["10.0.0.1/aaaaaaaaaaaa", "10.0.0.1/bbbbbbbbbbbb"]


SPARK_HEAD = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed barrier "
    "ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(3, 1) finished "
    "unsuccessfully.\n"
)


def test_a_ranks_own_failure_is_read_from_sparks_text():
    report = "rank 1 on 10.0.0.2 raised ValueError: no\nTraceback (most recent call last):\n  ...\nValueError: no\n"
    error = _stage_error(RuntimeError(SPARK_HEAD + f"org.apache.spark.api.python.PythonException: {FAILURE_BEGIN}"
                                      f"{report}{FAILURE_END}\n\tat org.apache..."), 2)  # fmt: skip
    assert str(error).startswith("rank 1 on 10.0.0.2 raised ValueError: no\n\nthe rank's traceback:\nTraceback")
    assert "Spark did not retry the stage" in str(error)
    assert error.rank == 1


def test_a_lost_executor_names_the_rank_and_the_executor():
    text = SPARK_HEAD + "ExecutorLostFailure (executor 7 exited caused by one of the running tasks) Reason: Command exited with code 137\n\tat x"
    error = _stage_error(RuntimeError(text), 2)
    assert str(error).startswith("rank 1 (Spark executor 7) was lost: ExecutorLostFailure (executor 7 exited")
    assert error.rank == 1


def test_anything_else_is_reported_with_sparks_first_line():
    error = _stage_error(RuntimeError("py4j went away\nmore"), 3)
    assert str(error) == "the Spark barrier stage of 3 ranks failed: py4j went away"


def test_run_elastics_hosts_are_the_executors_whose_tasks_still_beat():
    registry = RendezvousServer(b"k" * 32)  # in-process access only: nothing listens
    now = [100.0]
    hosts = SparkTaskDiscovery(registry, "job/tasks/", clock=lambda: now[0])
    registry.put({
        "job/tasks/task/t0.0": json.dumps({"host": "10.0.0.1/exec-0", "ip": "10.0.0.1"}),
        "job/tasks/task/t1.0": json.dumps({"host": "10.0.0.1/exec-0", "ip": "10.0.0.1"}),
        "job/tasks/task/t2.0": json.dumps({"host": "10.0.0.2/exec-1", "ip": "10.0.0.2"}),
        "job/tasks/beat/t0.0": "1", "job/tasks/beat/t1.0": "1", "job/tasks/beat/t2.0": "1",
    })
    assert hosts.find_available_hosts_and_slots() == {"10.0.0.1/exec-0": 2, "10.0.0.2/exec-1": 1}
    assert hosts.idle_task("10.0.0.1/exec-0", busy={"t0.0"}) == "t1.0"
    assert hosts.idle_task("10.0.0.2/exec-1", busy={"t2.0"}) is None
    now[0] += LOST_AFTER - 0.5
    registry.put({"job/tasks/beat/t0.0": "2", "job/tasks/beat/t1.0": "2"})  # t2.0's executor went quiet
    assert hosts.find_available_hosts_and_slots() == {"10.0.0.1/exec-0": 2, "10.0.0.2/exec-1": 1}
    now[0] += 1.0
    assert hosts.find_available_hosts_and_slots() == {"10.0.0.1/exec-0": 2}
    assert not hosts.alive("t2.0") and hosts.alive("t0.0")
    registry.put({"job/tasks/task/t2.1": json.dumps({"host": "10.0.0.3/exec-2", "ip": "10.0.0.3"})})
    assert hosts.find_available_hosts_and_slots() == {"10.0.0.1/exec-0": 2, "10.0.0.3/exec-2": 1}  # Spark's retry


def test_ray_logger_outside_a_call_with_callbacks_warns_once_and_drops_the_value():
    import warnings

    import pytest

    from hora.ray import ray_logger

    ray_logger.configure(None)
    ray_logger._warned = False
    with pytest.warns(UserWarning, match="logging is not configured"):
        ray_logger.log({"loss": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ray_logger.log({"loss": 0.5})  # once only, as Horovod's
