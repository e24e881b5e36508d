"""hora.ray.RayExecutor on a local Ray instance: results and ranks, Horovod's calls, a raising rank, a SIGKILLed
actor, restarting, too few resources, and no worker left running."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("ray")

from hora.errors import ConfigError, RunError, UnsupportedError
from hora.ray import RayExecutor
from support.ray_cluster import alive
from workers import engines


def _gone(pids: list[int]) -> list[int]:
    """The pids still alive after up to 10 s (ray.kill is asynchronous)."""
    deadline = time.monotonic() + 10.0
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _check_topology(out: list[dict], n: int) -> None:
    assert [r["rank"] for r in out] == list(range(n))
    assert all(r["size"] == n and r["tag"] == "tag" for r in out)
    # one Ray node: every rank is local, in rank order
    assert [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in out] == [
        (i, n, 0, 1) for i in range(n)
    ]
    assert {r["sum"] for r in out} == {n * (n - 1) / 2}
    assert {r["transport"] for r in out} == {"shm"}


def test_results_come_back_in_rank_order_with_the_placement(local_ray):
    executor = RayExecutor(num_workers=2)
    executor.start()
    try:
        out = executor.run(engines.topology, args=("tag",))
    finally:
        executor.shutdown()
    _check_topology(out, 2)
    assert _gone([r["pid"] for r in out]) == []


def test_horovods_calls_execute_run_remote_and_an_executable(local_ray):
    ray = local_ray
    executor = RayExecutor(num_workers=2, env={"HORA_TEST_FLAVOUR": "mint"})
    executor.start(executable_cls=engines.Counter, executable_args=(10,))
    try:
        assert executor.execute(lambda counter: counter.bump()) == [11, 11]
        assert executor.execute_single(lambda counter: counter.bump()) == 12
        refs = executor.run_remote(engines.topology, kwargs={"tag": 5})
        assert [r["rank"] for r in ray.get(refs)] == [0, 1]
        assert executor.run(lambda: os.environ["HORA_TEST_FLAVOUR"]) == ["mint", "mint"]
        logged: list[object] = []  # Horovod's ray_logger: what the ranks log reaches the driver's callbacks
        assert executor.execute(engines.log_twice, callbacks=[logged.append]) == [None, None]
        assert sorted(logged) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert [v for v in logged if v[0] == 0] == [(0, 0), (0, 1)]  # in the order each rank logged them
        with pytest.raises(UnsupportedError, match="run_remote"):
            executor.run_remote(engines.topology, callbacks=[logged.append])
    finally:
        executor.shutdown()
    executor.start()  # without executable_cls, execute() gets the worker's state
    try:
        states = executor.execute(lambda s: (s.rank, s.local_rank, s.size))
    finally:
        executor.shutdown()
    assert states == [(0, 0, 2), (1, 1, 2)]


def test_an_exception_names_the_rank_with_its_traceback_and_the_executor_restarts(local_ray):
    executor = RayExecutor(num_workers=3)
    executor.start()
    pids = executor.run(os.getpid)
    with pytest.raises(RunError) as info:
        executor.run(engines.fail_on, args=(1,))
    message = str(info.value)
    assert message.startswith("rank 1 on ")
    assert "raised ValueError" in message and "rank 1 refuses" in message
    assert "in fail_on" in message and "Traceback" in message
    assert "run_as_rank" not in message  # hora's own frames are left out
    assert isinstance(info.value.__cause__, ValueError)
    assert _gone(pids) == []  # the failure stopped every worker
    with pytest.raises(ConfigError, match="call start"):
        executor.run(os.getpid)
    executor.start()  # a fresh group of 3 ranks
    try:
        out = executor.run(engines.topology, args=("tag",))
    finally:
        executor.shutdown()
    _check_topology(out, 3)


def test_a_worker_sigkilled_mid_allreduce_is_a_clear_error(local_ray, tmp_path):
    executor = RayExecutor(num_workers=2)
    executor.start()
    pids = executor.run(os.getpid)

    def kill_rank_1():
        engines.wait_for(tmp_path / "started.1")
        os.kill(pids[1], signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    try:
        with pytest.raises(RunError) as info:
            executor.run(engines.allreduce_loop, args=(str(tmp_path), 100_000))
    finally:
        killer.join()
    assert str(info.value).startswith("rank 1 on ")
    assert f"(pid {pids[1]}): the Ray actor died" in str(info.value)
    assert _gone(pids) == []
    executor.start()  # and a fresh group runs
    try:
        assert [r["rank"] for r in executor.run(engines.topology)] == [0, 1]
    finally:
        executor.shutdown()


def test_ctrl_c_in_run_stops_the_workers_at_once(local_ray, tmp_path):
    """Issue 27, item 10: a KeyboardInterrupt in run() left the actors training until the driver exited."""
    executor = RayExecutor(num_workers=2)
    executor.start()

    def interrupt_once_both_train():
        engines.wait_for(tmp_path / "started.0")
        engines.wait_for(tmp_path / "started.1")
        os.kill(os.getpid(), signal.SIGINT)  # the driver's Ctrl-C, delivered to its main thread

    interrupter = threading.Thread(target=interrupt_once_both_train)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            executor.run(engines.allreduce_loop, args=(str(tmp_path), 10**9))
    finally:
        interrupter.join()
    assert _gone(list(engines.pids(tmp_path).values())) == []  # while this driver lives on
    executor.start()  # and the executor can start again
    try:
        assert [r["rank"] for r in executor.run(engines.topology)] == [0, 1]
    finally:
        executor.shutdown()


def test_more_workers_than_the_cluster_holds_is_refused(local_ray):
    settings = RayExecutor.create_settings(placement_group_timeout_s=2)
    executor = RayExecutor(settings, num_workers=9)
    with pytest.raises(ConfigError, match=r"Ray could not place 9 workers .* Lower num_workers"):
        executor.start()
    assert executor.workers == []


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="num_workers must be at least 1"):
        RayExecutor(num_workers=0)
    with pytest.raises(ConfigError, match="placement_strategy"):
        RayExecutor(num_workers=2, placement_strategy="RANDOM")


def test_the_shared_digits_example_trains_on_ray(local_ray):
    executor = RayExecutor(num_workers=2)
    executor.start()
    try:
        out = executor.run(engines.digits_train(), kwargs={"epochs": 1})
    finally:
        executor.shutdown()
    assert [(r["rank"], r["size"], r["steps"]) for r in out] == [(0, 2, 22), (1, 2, 22)]
    assert out[0]["accuracy"] == out[1]["accuracy"] > 40.0  # one epoch: well above chance (10%)


DRIVER = """
import sys, ray
from hora.ray import RayExecutor
from workers import engines
ray.init(address=sys.argv[1])
executor = RayExecutor(num_workers=2)
executor.start()
executor.run(engines.allreduce_loop, args=(sys.argv[2], 1_000_000))
"""


def test_no_worker_outlives_a_sigkilled_driver(local_ray, tmp_path):
    """Horovod on Spark's old sore ("the driver dies, but the MPI processes live on"): the ranks are the driver's
    actors, so Ray ends them with it."""
    import subprocess
    import sys

    address = local_ray.get_runtime_context().gcs_address
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(tmp_path)])
    try:
        engines.wait_for(tmp_path / "started.0")
        engines.wait_for(tmp_path / "started.1")
        ranks = engines.pids(tmp_path)
    finally:
        driver.kill()
        driver.wait()
    assert sorted(ranks) == [0, 1]
    assert _gone(list(ranks.values())) == []
