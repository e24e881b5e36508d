"""Tuning trials on a Ray cluster: a 2-node local Ray cluster (Ray's cluster_utils, 1 CPU per node), a tuning job of
4 one-CPU trials, 2 at a time, so both nodes are used. Every trial runs as a hora job on its node with the code and
the local channel shipped through Ray's object store, and is mirrored here: an ordinary job of this machine's store
(list, describe with its node, logs, metrics), its objective read from the mirrored metrics, its artifacts brought
home to the output path. Nothing is left on the nodes, and nothing of Ray after the cluster's shutdown."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

from hora.cli import main
from hora.jobs import CategoricalParameter, Estimator, HyperparameterTuner, JobStore
from hora.jobs.tuning_store import TuningStore
from support.ray_cluster import processes_under, ray_environment, settle

#: acc = width/10 + the offset read from the training channel; the model is a file naming the width.
SCRIPT = """
import argparse, os, pathlib, time
p = argparse.ArgumentParser()
p.add_argument("--width", type=float)
a, _ = p.parse_known_args()
offset = float(pathlib.Path(os.environ["SM_CHANNEL_TRAINING"], "offset.txt").read_text())
for epoch in range(2):
    time.sleep(1)
    print(f"epoch {epoch} acc={a.width / 10 + offset + epoch / 100:.4f}", flush=True)
pathlib.Path(os.environ["SM_MODEL_DIR"], "model.txt").write_text(f"width {a.width:g}")
"""


@pytest.fixture(scope="module")
def two_one_cpu_nodes():
    """A head and a second raylet of 1 CPU each; the nodes' temp dir (where trials run) is a fresh one."""
    from ray.cluster_utils import Cluster

    mp = pytest.MonkeyPatch()
    tmp = ray_environment(mp)
    node_tmp = tempfile.mkdtemp(prefix="hrn-", dir="/tmp")
    mp.setenv("TMPDIR", node_tmp)  # the nodes' (and the trials') tempfile.gettempdir()
    cluster = None
    try:
        node = {"num_cpus": 1, "object_store_memory": 80 << 20}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "temp_dir": tmp})
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster, Path(node_tmp)
    finally:
        if cluster is not None:
            cluster.shutdown()
        mp.undo()
        left = settle(lambda: processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(node_tmp, ignore_errors=True)
        assert left == [], f"Ray processes outlived the cluster: {left}"


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_four_trials_two_at_a_time_on_a_two_node_ray_cluster(tmp_path, two_one_cpu_nodes, capsys):
    cluster, node_tmp = two_one_cpu_nodes
    src, data, out = tmp_path / "src", tmp_path / "data", tmp_path / "out"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    data.mkdir()
    (data / "offset.txt").write_text("0.5")
    home = tmp_path / "home"
    est = Estimator(home=str(home), entry_point="train.py", source_dir=str(src), output_path=str(out),
                    metric_definitions=[{"Name": "acc", "Regex": r"acc=([0-9.]+)"}])
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([1, 2, 3, 4])}, strategy="Grid",
                                max_parallel_jobs=2, ray_address=cluster.address)
    tuner.fit({"training": str(data)}, job_name="raygrid", wait=True)
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
    assert _most_at_once([(r.created, r.ended) for r in trials.values()]) <= 2  # type: ignore[misc]

    # hora job list / describe show them with their node
    assert main(["job", "--home", str(home), "list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{name}" in listing for name in trials) and listing.count(" on ray:") == 4
    name = best["TrainingJobName"]
    assert main(["job", "--home", str(home), "describe", name]) == 0
    text = capsys.readouterr().out
    assert f"node id {trials[name].spec['ray']['node_id']}" in text
    assert "placed on Ray node" in text

    # the supervisor has gone, and with it every trial's directory on the nodes
    tstore = TuningStore(store)
    assert settle(lambda: tstore.supervisor_pid("raygrid"), 30) is None
    assert not (node_tmp / f"hora-ray-{os.getuid()}").exists(), list(node_tmp.rglob("*"))[:10]
    assert [p.name for p in node_tmp.iterdir() if not p.name.startswith("ray")] == [], list(node_tmp.iterdir())

