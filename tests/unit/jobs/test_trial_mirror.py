"""The mirror of a trial run in another job store (a Ray node's): what a node answers from a cursor, and what the
mirror writes here from it. Two real job stores; no Ray."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from hora.jobs import trial_mirror
from hora.jobs.ray_trials import pack, trial_resources
from hora.jobs.spec import parse_spec
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobStore
from hora.jobs.trial_mirror import TrialMirror, node_answer
from hora.jobs.tuner import ray_problems

SPEC = {"entry_point": "train.py", "source_dir": "/src", "job_name": "t-001"}


def _stores(tmp_path):
    node, here = JobStore(tmp_path / "node"), JobStore(tmp_path / "here")
    node.create("t-001", SPEC)
    here.create("t-001", {**SPEC, "ray": {"address": "auto"}})
    return node, here


def _log(node: JobStore, file: str, text: str) -> None:
    logs = node.job_dir("t-001") / "logs"
    logs.mkdir(exist_ok=True)
    with open(logs / file, "a") as f:
        f.write(text)


def test_the_mirror_holds_the_end_back_until_the_supervisor_exited_and_everything_is_drained(tmp_path, monkeypatch):
    node, here = _stores(tmp_path)
    mirror = TrialMirror(here, "t-001")
    node.update("t-001", started=100.0, supervisor_pid=os.getpid())
    node.transition("t-001", JobStatus.InProgress, SecondaryStatus.Training, "training", at=101.0)
    _log(node, "algo-1.log", "line 1\nline 2\n")
    node.add_metrics("t-001", [("acc", 0.5, 102.0, "algo-1", 0, 1)])
    node.add_system_metrics("t-001", [("algo-1", 102.0, "cpu", 0.25), ("algo-1", 102.0, "memory", 0.5)])
    mirror.apply(node_answer(node, "t-001", mirror.cursor, exited=False))
    assert list(here.iter_system_metrics("t-001")) == [("algo-1", 102.0, "cpu", 0.25), ("algo-1", 102.0, "memory", 0.5)]
    r = here.get("t-001")
    assert (r.status, r.secondary_status, r.started) == ("InProgress", "Training", 100.0)
    assert here.metrics("t-001") == [("acc", 0.5, 102.0, "algo-1", 0, 1)]
    assert (here.job_dir("t-001") / "logs" / "algo-1.log").read_text() == "line 1\nline 2\n"
    assert here.transitions("t-001")[-1] == (101.0, "InProgress", "Training", "training")

    # the job ends on the node, but its supervisor has not exited: the end is held back, the rest comes
    _log(node, "algo-1.log", "line 3 is long\n")
    node.add_metrics("t-001", [("acc", 0.75, 103.0, "algo-1", 0, 1)])
    node.update("t-001", ended=104.0, failure_reason=None, exit_code=0, artifacts={"model": "/n/model.tar.gz"})
    node.transition("t-001", JobStatus.Completed, SecondaryStatus.Completed, "", at=104.0)
    answer = node_answer(node, "t-001", mirror.cursor, exited=False)
    assert not answer["final"] and answer["transitions"] == []
    mirror.apply(answer)
    assert here.get("t-001").status == "InProgress" and len(here.metrics("t-001")) == 2

    # exited, but the logs come in small chunks: final only with the last one, and nothing twice
    _log(node, "job.log", "0123456789" * 3)
    monkeypatch.setattr(trial_mirror, "LOG_CHUNK", 8)
    rounds = 0
    while not mirror.done:
        answer = node_answer(node, "t-001", mirror.cursor, exited=True)
        mirror.apply(answer, {"model": "/home/model.tar.gz"} if answer["final"] else None)
        rounds += 1
        assert rounds < 10
    assert rounds == 4  # 30 bytes of job.log, 8 at a time
    r = here.get("t-001")
    assert (r.status, r.ended, r.exit_code, r.artifacts) == ("Completed", 104.0, 0, {"model": "/home/model.tar.gz"})
    assert (here.job_dir("t-001") / "logs" / "algo-1.log").read_text() == "line 1\nline 2\nline 3 is long\n"
    assert (here.job_dir("t-001") / "logs" / "job.log").read_text() == "0123456789" * 3
    assert [m[1] for m in here.metrics("t-001")] == [0.5, 0.75]
    assert len(list(here.iter_system_metrics("t-001"))) == 2
    steps = here.transitions("t-001")
    assert [s[1:3] for s in steps] == [("InProgress", "Starting"), ("InProgress", "Training"),
                                       ("Completed", "Completed")]
    assert (here.job_dir("t-001") / "hora" / "record.json").is_file()  # for hora job reindex
    mirror.apply(answer)  # a late repeat changes nothing
    assert len(here.metrics("t-001")) == 2


def test_a_log_name_that_is_not_a_file_of_logs_is_refused(tmp_path):
    _, here = _stores(tmp_path)
    answer = {"logs": {"../escape": b"x"}, "metrics": [], "record": {}, "transitions": [], "final": False,
              "cursor": trial_mirror.new_cursor()}
    with pytest.raises(Exception, match="not a file of a job's logs"):
        TrialMirror(here, "t-001").apply(answer)
    assert not (here.job_dir("t-001") / "escape").exists()


def test_pack_is_deterministic_and_keeps_a_single_file_by_name(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "x.py").write_text("print(1)")
    (tmp_path / "a" / "sub" / "y.txt").write_text("y")
    d1, data = pack(tmp_path / "a")
    assert pack(tmp_path / "a")[0] == d1
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["sub", "sub/y.txt", "x.py"]
    (tmp_path / "a" / "x.py").write_text("print(2)")
    assert pack(tmp_path / "a")[0] != d1
    _, data = pack(tmp_path / "a" / "x.py")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.getnames() == ["x.py"]


def test_ray_settings_are_checked_and_a_trial_asks_for_a_cpu_per_process(tmp_path):
    assert ray_problems(None, None) == []
    assert "ray_address must be a Ray cluster's address" in ray_problems("", None)[0]
    assert "set ray_address too" in ray_problems(None, {"CPU": 1})[0]
    assert "ray_resources must map Ray resource names" in ray_problems("auto", {"CPU": -1})[0]
    assert "ray_resources must map" in ray_problems("auto", {"CPU": True})[0]
    (tmp_path / "train.py").write_text("")
    spec = parse_spec({**SPEC, "source_dir": str(tmp_path), "instance_count": 2, "processes_per_host": 3})
    assert trial_resources(spec, None) == {"CPU": 6.0}
    assert trial_resources(spec, {"CPU": 1, "GPU": 1}) == {"CPU": 1, "GPU": 1}
