"""SageMaker's parameter_server distribution through real jobs: per host one worker (the script) and one TensorFlow
parameter server, TF_CONFIG as the TensorFlow container writes it, the servers serving on their addresses until the
job ends and gone after it, a dying server as the job's failure reason, and a ParameterServerStrategy Keras script
written for SageMaker trained unchanged."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from hora.jobs import JobStore, load_spec, parse_spec, start_job
from support import paths

# find_spec, not importorskip: the jobs import TensorFlow, this process need not (seconds of CPU)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="the parameter servers are TensorFlow's (the tensorflow extra)")
EXAMPLE = paths.REPO / "examples" / "jobs" / "ps_job.yaml"

#: Each host's script: what it was given, who runs beside it, whether every parameter server answers.
CENSUS = (paths.SCRIPTS / "tf_ps_census.py").read_text()


def _job(tmp_path: Path, name: str, mode: str, **fields):
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "train.py").write_text(CENSUS)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name, "instance_count": 2,
                       "distribution": {"parameter_server": {"enabled": True}},
                       "hyperparameters": {"out": str(out), "mode": mode}, "max_run": 240, **fields})  # fmt: skip
    store = JobStore(tmp_path / "home")
    return store, start_job(spec, store, wait=True, echo=False), out


def _alive(pid: int) -> bool:
    try:
        return ") Z" not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


def _leftovers(job_dir: Path) -> list[str]:
    """Processes of the job still running: every one of them has the job's directory in its command line or as
    its working directory (the parameter servers run in their host's directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if (str(job_dir) in cmd or cwd.startswith(str(job_dir))) and _alive(int(entry.name)):
                found.append(f"{entry.name}: {cmd}")
    return found


def _default_network() -> str:
    from hora.jobs import netns

    return "loopback" if netns.unavailable() else "namespace"


def _check_census(record, out: Path) -> dict[str, dict]:
    """Each host ran the script once, beside one TensorFlow parameter server (its task ps:<host index>), with the
    TF_CONFIG of the container and the SM_* variables of the distribution."""
    seen = {h: json.loads((out / f"{h}.json").read_text()) for h in ("algo-1", "algo-2")}
    assert sorted(p.name for p in out.iterdir()) == ["algo-1.json", "algo-2.json"]
    plan = json.loads((Path(record.job_dir) / "hora" / "plan.json").read_text())
    if plan["network"] == "namespace":  # exactly the container's: host names, ports 2222 (master, worker), 2223 (ps)
        workers, ps = ["algo-1:2222", "algo-2:2222"], ["algo-1:2223", "algo-2:2223"]
    else:  # one port space for every host: its own address, free ports
        workers, ps = plan["parameter_server"]["worker_addresses"], plan["parameter_server"]["ps_addresses"]
        assert [a.rsplit(":", 1)[0] for a in workers + ps] == plan["addresses"] * 2
        assert len(set(workers + ps)) == 4
    for index, host in enumerate(("algo-1", "algo-2")):
        got = seen[host]
        assert got["tf_config"] == {
            "cluster": {"master": workers[:1], "ps": ps, "worker": workers[1:]}, "environment": "cloud",
            "task": {"index": 0, "type": "master" if index == 0 else "worker"},
        }
        children = {int(pid): cmd for pid, cmd in got["children"].items()}
        others = [cmd for pid, cmd in children.items() if pid != got["me"]]
        assert got["me"] in children and len(others) == 1, children  # the script and one more: the server
        assert "-m hora.jobs._tf_ps " in others[0] and others[0].rstrip().endswith(f" {index}"), others
        assert got["ps_up"] == [True, True]
        assert got["argv"][:2] == ["--mode", "census" if record.status == "Completed" else "kill-ps"]
        sm = got["sm"]
        assert json.loads(sm["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_parameter_server_enabled": True}
        assert sm["SM_CURRENT_HOST"] == host and json.loads(sm["SM_HOSTS"]) == ["algo-1", "algo-2"]
        assert json.loads(sm["SM_TRAINING_ENV"])["distribution_hosts"] == ["algo-1", "algo-2"]
        hps = json.loads((Path(record.job_dir) / "hosts" / host / "input" / "config" / "hyperparameters.json").read_text())
        assert hps["sagemaker_parameter_server_enabled"] == "true"
        assert f"[{host} ps]<stdout> hora job: TensorFlow parameter server ps:{index} serving at {ps[index]}" in (
            Path(record.job_dir) / "logs" / f"{host}.log").read_text()
    return seen


def test_one_worker_and_one_parameter_server_per_host_with_the_containers_tf_config(tmp_path):
    _, record, out = _job(tmp_path, "ps-census", "census", network=_default_network())
    assert record.status == "Completed", record.failure_reason
    seen = _check_census(record, out)
    # the worker host's server served on after its script ended, until the master's script ended
    assert seen["algo-1"]["ps_up_after_workers_ended"] == [True, True]
    assert _leftovers(Path(record.job_dir)) == []  # the servers ended with the job


def test_a_dying_parameter_server_fails_the_job_and_is_named_as_the_reason(tmp_path):
    # on loopback addresses (the other test takes namespaces where it can): TF_CONFIG with each host's own ports
    _, record, out = _job(tmp_path, "ps-killed", "kill-ps", network="loopback")
    assert record.status == "Failed"
    seen = _check_census(record, out)
    pid = next(int(p) for p, c in seen["algo-2"]["children"].items() if "hora.jobs._tf_ps" in c)
    address = seen["algo-2"]["tf_config"]["cluster"]["ps"][1]
    assert record.failure_reason.splitlines()[0] == (
        f"AlgorithmError: host algo-2, the TensorFlow parameter server ps:1 at {address} (pid {pid}) failed first: "
        "killed by SIGKILL (exit code 137); the host's worker (rank 1) was stopped")
    assert record.exit_code == 137
    assert _leftovers(Path(record.job_dir)) == []


def test_one_host_runs_no_parameter_server_and_no_tf_config_as_the_container(tmp_path):
    _, record, out = _job(tmp_path, "ps-one-host", "census", instance_count=1)
    assert record.status == "Completed", record.failure_reason
    got = json.loads((out / "algo-1.json").read_text())
    assert got["tf_config"] is None and [int(p) for p in got["children"]] == [got["me"]]
    assert json.loads(got["sm"]["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_parameter_server_enabled": True}


def test_a_parameter_server_strategy_keras_script_for_sagemaker_runs_unchanged(tmp_path):
    store = JobStore(tmp_path / "home")
    record = start_job(load_spec(EXAMPLE, {"job_name": "ps-example"}), store, wait=True, echo=False)
    logs = "\n".join((Path(record.job_dir) / "logs" / f"{h}.log").read_text() for h in ("algo-1", "algo-2"))
    assert record.status == "Completed", f"{record.failure_reason}\n{logs[-6000:]}"
    losses = [v for name, v, *_ in store.metrics("ps-example") if name == "train:loss"]
    accuracy = [v for name, v, *_ in store.metrics("ps-example") if name == "test:accuracy"]
    assert len(losses) == 5 and losses[-1] < losses[0] / 2, losses
    assert len(accuracy) == 1 and accuracy[0] > 0.85, accuracy
    # the kernels were split over both parameter servers (a MinSizePartitioner with max_shards=2)
    assert 'kernel shards over the parameter servers: {"dense": 2, "dense_1": 2}' in logs, logs[-3000:]
    assert "worker 0: the chief is done" in logs
    with tarfile.open(record.artifacts["model"]) as tar:
        assert tar.getnames() == ["weights.npz"]
    assert _leftovers(Path(record.job_dir)) == []


def test_a_parameter_server_that_cannot_start_fails_the_job_with_its_own_words(tmp_path):
    # A job environment whose tensorflow cannot be imported (a package of that name that refuses, first on the path)
    hidden = tmp_path / "hidden"
    (hidden / "tensorflow").mkdir(parents=True)
    (hidden / "tensorflow" / "__init__.py").write_text("raise ImportError('tensorflow is hidden from this job')\n")
    _, record, _ = _job(tmp_path, "ps-no-tf", "kill-ps", environment={"PYTHONPATH": str(hidden)})
    assert record.status == "Failed"
    reason = record.failure_reason
    assert re.match(r"AlgorithmError: host algo-\d, the TensorFlow parameter server ps:\d at \S+ \(pid \d+\) failed "
                    r"first: exit code 1; the host's worker \(rank \d\) was stopped\n", reason), reason
    assert ("distribution parameter_server starts TensorFlow's parameter-server task on every host, as SageMaker's "
            "TensorFlow container does, but tensorflow cannot be imported here (tensorflow is hidden from this job); "
            "install tensorflow in the job's environment (requirements.txt)") in reason
    assert record.exit_code == 1
    assert _leftovers(Path(record.job_dir)) == []
