"""Tuning trials on a Ray cluster: a 2-node local Ray cluster (Ray's cluster_utils, 1 CPU per node), a tuning job of
4 one-CPU trials, 2 at a time, so both nodes are used. Every trial runs as a hora job on its node with the code and
the local channel shipped through Ray's object store, and is mirrored here: an ordinary job of this machine's store
(list, describe with its node, logs, metrics), its objective read from the mirrored metrics, its artifacts brought
home to the output path. Nothing is left on the nodes, and nothing of Ray after the cluster's shutdown. A node lost
mid-trial fails that trial with a reason naming the node, and takes the trial's processes with it."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from hora.cli import main
from hora.jobs import CategoricalParameter, Estimator, HyperparameterTuner, JobStore
from hora.jobs.tuning import wait_tuning_job
from hora.jobs.tuning_store import TuningStore
from support.intervals import most_at_once
from support.ray_cluster import local_cluster, settle

#: acc = width/10 + the offset read from the training channel; the model is a file naming the width.
SCRIPT = """
import argparse, os, pathlib, time
p = argparse.ArgumentParser()
p.add_argument("--width", type=float)
p.add_argument("--hold", type=int, default=0)
a, _ = p.parse_known_args()
offset = float(pathlib.Path(os.environ["SM_CHANNEL_TRAINING"], "offset.txt").read_text())
for epoch in range(2):
    time.sleep(1)
    print(f"epoch {epoch} acc={a.width / 10 + offset + epoch / 100:.4f}", flush=True)
    if a.hold:
        time.sleep(600)
pathlib.Path(os.environ["SM_MODEL_DIR"], "model.txt").write_text(f"width {a.width:g}")
"""


@pytest.fixture(scope="module")
def two_one_cpu_nodes():
    """A head and a second raylet of 1 CPU each; the nodes' temp dir (where trials run) is a fresh one."""
    mp = pytest.MonkeyPatch()
    node_tmp = tempfile.mkdtemp(prefix="hrn-", dir="/tmp")
    mp.setenv("TMPDIR", node_tmp)  # the nodes' (and the trials') tempfile.gettempdir()
    try:
        with local_cluster(mp, nodes=2, num_cpus=1) as cluster:
            yield cluster, Path(node_tmp)
    finally:
        mp.undo()
        shutil.rmtree(node_tmp, ignore_errors=True)

METRICS = [{"Name": "acc", "Regex": r"acc=([0-9.]+)"}]


def _job(tmp_path, offset: str, **fields) -> tuple[Estimator, Path]:
    """The trials' script in ``src/``, a ``data/`` channel holding ``offset``, and an Estimator over them."""
    src, data, home = tmp_path / "src", tmp_path / "data", tmp_path / "home"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    data.mkdir()
    (data / "offset.txt").write_text(offset)
    est = Estimator(home=str(home), entry_point="train.py", source_dir=str(src), metric_definitions=METRICS,
                    **fields)
    return est, home

def test_four_trials_two_at_a_time_on_a_two_node_ray_cluster(tmp_path, two_one_cpu_nodes, capsys):
    cluster, node_tmp = two_one_cpu_nodes
    out = tmp_path / "out"
    est, home = _job(tmp_path, "0.5", output_path=str(out))
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([1, 2, 3, 4])}, strategy="Grid",
                                max_parallel_jobs=2, ray_address=cluster.address)
    tuner.fit({"training": str(tmp_path / "data")}, job_name="raygrid", wait=True)
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Completed", desc.get("FailureReason")
    assert desc["TrainingJobStatusCounters"]["Completed"] == 4
    best = desc["BestTrainingJob"]
    assert best["TunedHyperParameters"] == {"width": "4"}
    assert best["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == pytest.approx(0.91)

    store = JobStore(home)
    trials = {r.name: r for r in store.jobs()}
    assert len(trials) == 4 and all(r.status == "Completed" for r in trials.values())
    nodes = set()
    for name, r in trials.items():
        width = float(r.spec["hyperparameters"]["width"])
        assert [m[1] for m in store.metrics(name)] == pytest.approx([width / 10 + 0.5, width / 10 + 0.51])
        ray = r.spec["ray"]
        assert ray["resources"] == {"CPU": 1.0} and ray["node_job_dir"]
        nodes.add(ray["node_id"])
        # the artifacts are home, where a local trial's would be
        assert r.artifacts["model"] == str(out / name / "output" / "model.tar.gz")
        with tarfile.open(r.artifacts["model"]) as tar:
            assert tar.extractfile("model.txt").read() == f"width {width:g}".encode()  # type: ignore[union-attr]
        assert Path(r.artifacts["output"]).is_file()
        # its logs are here too
        assert main(["job", "--home", str(home), "logs", name]) == 0
        assert f"acc={width / 10 + 0.51:.4f}" in capsys.readouterr().out
    assert len(nodes) == 2, "both nodes ran trials"
    assert most_at_once([(r.created, r.ended) for r in trials.values()]) <= 2  # type: ignore[misc]

    # hora job list / describe show them with their node
    assert main(["job", "--home", str(home), "list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{name}" in listing for name in trials) and listing.count(" on ray:") == 4
    name = best["TrainingJobName"]
    assert main(["job", "--home", str(home), "describe", name]) == 0
    text = capsys.readouterr().out
    assert f"node id {trials[name].spec['ray']['node_id']}" in text
    assert "placed on Ray node" in text

    assert main(["job", "--home", str(home), "tune", "describe", "raygrid"]) == 0
    assert f"Trials run on:     the Ray cluster at {cluster.address}" in capsys.readouterr().out

    # the supervisor has gone, and with it every trial's directory on the nodes
    tstore = TuningStore(store)
    assert settle(lambda: tstore.supervisor_pid("raygrid"), 30) is None
    assert not (node_tmp / f"hora-ray-{os.getuid()}").exists(), list(node_tmp.rglob("*"))[:10]
    assert [p.name for p in node_tmp.iterdir() if not p.name.startswith("ray")] == [], list(node_tmp.iterdir())


def _processes_in(directory: Path) -> list[int]:
    """Processes whose command line or working directory is under ``directory`` (a trial's, on its node)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                where = (entry / "cmdline").read_bytes() + os.fsencode(os.readlink(entry / "cwd"))
            except OSError:
                continue
            if os.fsencode(str(directory)) in where:
                out.append(int(entry.name))
    return out


def _describe(pid: int) -> str:
    """A process left behind: its parent and command line (for the failure message)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid}: gone"
    return f"{pid} ({next(line for line in status if line.startswith('PPid'))}): {cmd[:300]}"


def test_a_node_lost_mid_trial_fails_that_trial_naming_the_node(tmp_path, two_one_cpu_nodes):
    cluster, node_tmp = two_one_cpu_nodes
    doomed = cluster.add_node(num_cpus=1, resources={"doomed": 1}, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    est, home = _job(tmp_path, "0", hyperparameters={"hold": 1})
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([1])}, strategy="Grid",
                                ray_address=cluster.address, ray_resources={"CPU": 1, "doomed": 1})
    tuner.fit({"training": str(tmp_path / "data")}, job_name="raylost", wait=False)
    store, tstore = JobStore(home), TuningStore(JobStore(home))
    deadline = time.monotonic() + 240
    while not (store.jobs() and store.metrics(store.jobs()[0].name)):  # it runs on the doomed node
        assert time.monotonic() < deadline, tstore.state("raylost")
        time.sleep(0.5)
    trial = store.jobs()[0]
    node_id = trial.spec["ray"]["node_id"]
    assert node_id == doomed.node_id
    assert _processes_in(node_tmp) != []
    cluster.remove_node(doomed)
    state = wait_tuning_job(tstore, "raylost", timeout=240)
    record = store.get(trial.name)
    assert record.status == "Failed"
    assert f"node id {node_id}" in (record.failure_reason or ""), record.failure_reason
    assert state["trials"][0]["status"] == "Failed" and state["status"] == "Completed"
    # the trial's supervisor and script on the lost node got SIGTERM when its actor died
    left = settle(lambda: _processes_in(node_tmp), 60)
    assert left == [], [_describe(pid) for pid in left] + [f.read_text()[-2000:] for f in node_tmp.rglob("job.log")]


def test_a_trial_wider_than_every_node_fails_the_tuning_job_at_once(tmp_path, two_one_cpu_nodes):
    cluster, _ = two_one_cpu_nodes
    est, _ = _job(tmp_path, "0", processes_per_host=3)
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([1])}, strategy="Grid",
                                ray_address=cluster.address)
    tuner.fit(job_name="raywide", wait=False)
    state = wait_tuning_job(TuningStore(JobStore(tmp_path / "home")), "raywide", timeout=120)
    assert state["status"] == "Failed" and state["trials"] == []
    assert "each trial asks Ray for CPU 3, but no node of the Ray cluster" in state["failure_reason"]
    assert "CPU 1" in state["failure_reason"] and "set ray_resources" in state["failure_reason"]


def test_hora_job_stop_of_a_trial_stops_it_on_its_node_and_brings_its_artifacts_home(tmp_path, two_one_cpu_nodes):
    cluster, node_tmp = two_one_cpu_nodes
    est, home = _job(tmp_path, "0", hyperparameters={"hold": 1}, stop_grace=5)
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([2])}, strategy="Grid",
                                ray_address=cluster.address)
    tuner.fit({"training": str(tmp_path / "data")}, job_name="raystop", wait=False)
    store = JobStore(home)
    deadline = time.monotonic() + 240
    while not (store.jobs() and store.metrics(store.jobs()[0].name)):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    name = store.jobs()[0].name
    assert main(["job", "--home", str(home), "stop", name]) == 0
    state = wait_tuning_job(TuningStore(store), "raystop", timeout=240)
    record = store.get(name)
    assert record.status == "Stopped" and state["trials"][0]["status"] == "Stopped"
    assert state["trials"][0]["objective"] == pytest.approx(0.2)
    assert Path(record.artifacts["model"]).is_file() and record.artifacts["model"].startswith(str(home))
    assert any(step[3] == "stop requested" for step in store.transitions(name))
    assert settle(lambda: _processes_in(node_tmp), 60) == []
