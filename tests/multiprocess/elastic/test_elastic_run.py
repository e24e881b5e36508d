"""Elastic ``hora run`` with real workers on loopback "hosts" (127.0.0.x): a worker killed mid-step, a host added
to the discovery output, the reset limit, a blacklisted host's cooldown, too few slots, a failing discovery script.
Faults come from the scripts themselves (tests/workers/elastic_*.py), at fixed steps, so every run is the same."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from hora.errors import ConfigError, HostError
from hora.runner import RunResult, run_command
from support import netns_hosts, paths

WORKERS = paths.TESTS / "workers"
HOSTS3 = "127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"


def elastic_run(script: str, *args: str, np: int, hosts: str | None = None, **elastic) -> RunResult:
    command = [sys.executable, str(WORKERS / script), *args]
    return run_command(command, np=np, hosts=hosts, capture=True, timeout=120, elastic=elastic)


def output(result: RunResult, stream: str = "stdout") -> str:
    return "\n".join(line for lines in result.lines.values() for line in lines.get(stream, []))


def steps(out: Path) -> list[tuple[int, int]]:
    """(step, size) of every step rank 0 completed, in order."""
    return [tuple(map(int, line.split())) for line in (out / "log").read_text().splitlines()]  # type: ignore[misc]


def test_a_worker_killed_mid_step_leaves_and_the_rest_finish_as_a_clean_run_from_the_last_commit(tmp_path):
    torch = pytest.importorskip("torch")
    elastic_dir, clean_dir = tmp_path / "elastic", tmp_path / "clean"
    elastic_dir.mkdir(), clean_dir.mkdir()
    # 3 ranks, a commit every 3 steps; the worker on 127.0.0.3 dies after its backward pass of step 7.
    result = elastic_run(
        "elastic_torch.py", "--out", str(elastic_dir), "--kill", "127.0.0.3:0:7", np=3, hosts=HOSTS3, min_np=2
    )
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    assert steps(elastic_dir) == [(s, 3) for s in range(7)] + [(s, 2) for s in range(6, 12)]  # back to step 6
    resumed = torch.load(elastic_dir / "resume.pt")
    assert resumed["step"] == 6
    # The same two ranks, started cleanly from that commit, end with the same weights, bit for bit.
    clean = run_command(
        [
            sys.executable,
            str(WORKERS / "elastic_torch.py"),
            "--out",
            str(clean_dir),
            "--resume",
            str(elastic_dir / "resume.pt"),
        ],
        np=2,
        capture=True,
        timeout=120,
    )
    assert clean.exit_code == 0, clean.report()
    a, b = torch.load(elastic_dir / "final.pt"), torch.load(clean_dir / "final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _third_host_once_running(tmp_path: Path) -> tuple[Path, threading.Thread]:
    """A discovery file with hosts 127.0.0.2 and .3, and a thread that adds 127.0.0.4 once the job runs (rank 0
    logged a step)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2\n127.0.0.3\n")

    def add_host():
        while not (tmp_path / "log").exists():
            time.sleep(0.05)
        with hosts.open("a") as f:
            f.write("127.0.0.4\n")

    adder = threading.Thread(target=add_host, daemon=True)
    adder.start()
    return hosts, adder


def test_a_host_added_to_the_discovery_output_joins_at_the_next_commit(tmp_path):
    hosts, adder = _third_host_once_running(tmp_path)
    result = elastic_run(
        "elastic_numpy.py",
        "--out",
        str(tmp_path),
        "--hold-at",
        "5",
        "--hold-size",
        "3",
        "--steps",
        "10",
        np=2,
        max_np=3,
        host_discovery_script=f"cat {hosts}",
    )
    adder.join(5)
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    assert steps(tmp_path) == [(s, 2) for s in range(5)] + [(s, 3) for s in range(5, 10)]
    # the new worker got the state by the sync: every rank ends with 5 steps of 1+2 and 5 of 1+2+3
    finished = sorted(line for line in output(result).splitlines() if line.startswith("finished"))
    assert finished == [f"finished rank {r} of 3 max_size 3 total 45" for r in range(3)]


def test_a_worker_dying_while_its_round_assembles_does_not_hold_the_others_for_the_start_timeout(tmp_path):
    """A host added mid-job has a worker that dies before init(): the launcher calls the round's start-up off, so
    the others stop waiting for it at once (not after --start-timeout, here longer than the job's time limit)."""
    hosts, adder = _third_host_once_running(tmp_path)
    command = [sys.executable, str(WORKERS / "elastic_numpy.py"), "--out", str(tmp_path), "--steps", "12",
               "--step-sleep", "0.1", "--die-at-start", "127.0.0.4"]  # fmt: skip
    result = run_command(command, np=2, capture=True, timeout=120, start_timeout=300,
                         elastic={"max_np": 3, "host_discovery_script": f"cat {hosts}"})  # fmt: skip
    adder.join(5)
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    assert {size for _, size in steps(tmp_path)} == {2} and steps(tmp_path)[-1] == (11, 2)


def test_past_the_reset_limit_the_job_ends_with_horovods_message(tmp_path):
    result = elastic_run(
        "elastic_numpy.py",
        "--out",
        str(tmp_path),
        "--kill",
        "127.0.0.3:0:3",
        "--kill",
        "127.0.0.4:0:6",
        np=3,
        hosts=HOSTS3,
        min_np=1,
        reset_limit=1,
    )
    assert result.exit_code == 1
    assert "Horovod was shutdown because number of resets during elastic job exceeded limit: 1" in result.report()
    assert steps(tmp_path)[-1][1] == 2  # the first reset went through: the job ran on with two ranks


def test_a_blacklisted_host_returns_after_its_cooldown(tmp_path):
    # 127.0.0.3's worker dies at step 3; the job goes on alone; after 1-2 s the host is back and the job grows.
    result = elastic_run(
        "elastic_numpy.py",
        "--out",
        str(tmp_path),
        "--kill",
        "127.0.0.3:0:3",
        "--hold-at",
        "8",
        "--hold-size",
        "2",
        "--steps",
        "12",
        np=2,
        hosts="127.0.0.2:1,127.0.0.3:1",
        min_np=1,
        blacklist_cooldown_range=(1, 2),
    )
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    assert steps(tmp_path) == [(s, 2) for s in range(4)] + [(s, 1) for s in range(4, 8)] + [
        (s, 2) for s in range(8, 12)
    ]


def test_too_few_slots_end_the_job_after_the_elastic_timeout(tmp_path):
    started = time.monotonic()
    result = run_command(
        [sys.executable, "-c", "pass"],
        np=2,
        capture=True,
        timeout=60,
        elastic_timeout=1,
        elastic={"host_discovery_script": "echo 127.0.0.2", "min_np": 2},
    )
    assert result.exit_code == 1 and time.monotonic() - started < 20
    assert "timed out waiting for the minimum number of slots to become available: 2 needed, 1 usable" in (
        result.report()
    )
    assert result.returncodes == []  # no worker was started


def test_a_discovery_script_failing_at_the_start_fails_the_job_before_anything_starts():
    with pytest.raises(ConfigError, match="host discovery script 'exit 3' failed with exit code 3"):
        run_command([sys.executable, "-c", "pass"], np=2, elastic={"host_discovery_script": "exit 3"})


def test_a_remote_host_that_cannot_be_reached_fails_the_job_before_anything_starts():
    with pytest.raises(HostError, match="node-7"):
        run_command([sys.executable, "-c", "pass"], np=1, elastic={"host_discovery_script": "echo node-7:2"})


def test_workers_on_ssh_hosts_go_on_without_a_lost_one(netns_cluster, tmp_path, capsys):
    c = netns_cluster
    a, b = c.hosts[0].addr, c.hosts[1].addr
    hosts = tmp_path / "hosts"
    hosts.write_text(f"localhost:1\n{a}:1\n{b}:1\n")
    result = run_command(
        [sys.executable, str(WORKERS / "elastic_numpy.py"), "--out", str(tmp_path), "--kill", f"{b}:0:4"],
        np=3, capture=True, timeout=120, elastic={"host_discovery_script": f"cat {hosts}", "min_np": 1},
        **c.ssh_kwargs(),
    )
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    assert steps(tmp_path) == [(s, 3) for s in range(5)] + [(s, 2) for s in range(5, 20)]
    assert f"host {b} is blacklisted" in capsys.readouterr().err
    finished = sorted(line for line in output(result).splitlines() if line.startswith("finished"))
    assert finished == [f"finished rank {r} of 2 max_size 2 total {5 * 6 + 15 * 3}" for r in range(2)]
    deadline = time.monotonic() + 20  # nothing of the job is left on the hosts: only their sshd runs there
    while any(c.processes_in(h.netns) - {h.pid} for h in c.hosts[:2]) or netns_hosts.job_processes(result.job_id):
        assert time.monotonic() < deadline, "processes of the job were left on the SSH hosts"
        time.sleep(0.1)


def test_a_worker_sent_sigterm_leaves_at_the_next_commit_and_no_step_is_lost(tmp_path, capsys):
    result = elastic_run(
        "elastic_numpy.py",
        "--out",
        str(tmp_path),
        "--term",
        "127.0.0.3:0:4",
        "--steps",
        "12",
        np=3,
        hosts=HOSTS3,
        min_np=1,
    )
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    done = steps(tmp_path)
    assert [s for s, _ in done] == list(range(12))  # every step once: no rollback
    sizes = [n for _, n in done]
    left_at = sizes.index(2)
    assert sizes == [3] * left_at + [2] * (12 - left_at) and left_at >= 5  # it finished the step it was warned in
    total = 6 * left_at + 3 * (12 - left_at)  # 1+2+3 per step with three ranks, 1+2 with two
    finished = sorted(line for line in output(result).splitlines() if line.startswith("finished"))
    assert finished == [f"finished rank {r} of 2 max_size 2 total {total}" for r in range(2)]
    assert result.returncodes[1] == -15  # it ended as SIGTERM would have ended it, once it could
    said = capsys.readouterr().err  # hora run's own notes
    assert "worker 127.0.0.3:0 got SIGTERM: host 127.0.0.3 leaves the job at the next commit()" in said
    assert "worker 1 (127.0.0.3:0) left the job" in said


def _two_left_with_the_same_weights(result: RunResult, unit: str, last: int) -> None:
    """The job succeeded; two workers finished at ``unit`` ``last`` with the same weights (their digest)."""
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    finished = sorted(line.split() for line in output(result).splitlines() if line.startswith("finished"))
    assert [f[:7] for f in finished] == [["finished", "rank", str(r), "of", "2", unit, str(last)] for r in range(2)]
    assert finished[0][-1] == finished[1][-1]


#: (not imported to check: importing TensorFlow changes the environment, which the suite's hygiene refuses)
needs_tensorflow = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")


@needs_tensorflow
def test_keras_model_fit_with_the_elastic_callbacks_goes_on_after_a_worker_is_killed(tmp_path):
    # 4 epochs of 8 batches, a commit every 2 batches; 127.0.0.3's worker dies at batch 3 of epoch 1.
    result = elastic_run(
        "elastic_keras.py", "--out", str(tmp_path), "--kill", "127.0.0.3:0@1@3", np=3, hosts=HOSTS3, min_np=2
    )
    _two_left_with_the_same_weights(result, "epoch", 4)
    assert steps(tmp_path) == [(1, 3), (2, 2), (3, 2), (4, 2)]  # (epochs done, size) at each epoch's end


@needs_tensorflow
def test_a_tensorflow_custom_loop_goes_back_to_its_last_commit_after_a_worker_is_killed(tmp_path):
    # A failure inside the tf.function reaches hvd.elastic.run as tf.errors.UnknownError: it must reset, not crash.
    result = elastic_run(
        "elastic_tf.py", "--out", str(tmp_path), "--kill", "127.0.0.3:0@5", np=3, hosts=HOSTS3, min_np=2
    )
    _two_left_with_the_same_weights(result, "step", 10)
    assert steps(tmp_path) == [(s, 3) for s in range(5)] + [(s, 2) for s in range(4, 10)]  # back to the step-4 commit


def test_a_frozen_worker_is_shown_where_it_was_then_killed_and_the_job_goes_on(tmp_path, capsys):
    result = run_command(
        [sys.executable, str(WORKERS / "elastic_numpy.py"), "--out", str(tmp_path), "--freeze", "127.0.0.3:0:4"],
        np=3, hosts=HOSTS3, capture=True, timeout=120, op_timeout=2, elastic={"min_np": 1},
    )
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    said = capsys.readouterr().err
    assert "worker 1 (127.0.0.3:0) did not leave round 1 while every other worker did: it is stuck at " in said
    assert "elastic_numpy.py:42 in think_very_hard" in said
    assert steps(tmp_path)[-1] == (19, 2)


def test_sigterm_to_an_ssh_hosts_agent_is_a_graceful_leave(netns_cluster, tmp_path, capsys):
    """A spot reclaim signals the host: its agent passes SIGTERM to the worker, which leaves at its next commit."""
    c = netns_cluster
    a, b = c.hosts[0], c.hosts[1]
    hosts = tmp_path / "hosts"
    hosts.write_text(f"localhost:1\n{a.addr}:1\n{b.addr}:1\n")

    def reclaim_b() -> None:
        while not (tmp_path / "log").exists() or len(steps(tmp_path)) < 5:
            time.sleep(0.05)
        for pid in c.processes_in(b.netns) - {b.pid}:
            try:
                if b"hora.runner.host_agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
            except OSError:
                pass

    reclaimer = threading.Thread(target=reclaim_b, daemon=True)
    reclaimer.start()
    result = run_command(
        [sys.executable, str(WORKERS / "elastic_numpy.py"), "--out", str(tmp_path), "--steps", "40",
         "--step-sleep", "0.05"],
        np=3, capture=True, timeout=120, elastic={"host_discovery_script": f"cat {hosts}", "min_np": 1},
        **c.ssh_kwargs(),
    )
    reclaimer.join(5)
    assert result.exit_code == 0, result.report() + output(result, "stderr")
    done = steps(tmp_path)
    assert [s for s, _ in done] == list(range(40))  # no step lost or repeated
    sizes = [n for _, n in done]
    assert sizes[0] == 3 and sizes[-1] == 2 and sorted(sizes, reverse=True) == sizes
    assert f"host {b.addr} leaves the job at the next commit()" in capsys.readouterr().err
