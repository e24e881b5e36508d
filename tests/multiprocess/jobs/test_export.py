"""TensorBoard and MLflow export of a real job (1 host x 2 processes), read back with TensorBoard's
EventAccumulator and MLflow's MlflowClient and compared with the job store."""

from __future__ import annotations

import collections
import tarfile
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the TensorBoard export needs the tensorboard extra")
pytest.importorskip("mlflow", reason="the MLflow export needs the mlflow extra")
pytest.importorskip("sqlalchemy", reason="a SQLite MLflow store needs the mlflow extra's sqlalchemy")

from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from hora.cli import main
from hora.jobs import JobStore, parse_spec, start_job

# Rank 0 writes an event file of its own into its TensorBoard directory and waits (bounded) until it shows up at
# the destination: the sync happens while the job runs, not only at its end.
SCRIPT = """
    import json, os, sys, time
    from tensorboard.summary import Writer

    rank = int(os.environ["HORA_RANK"])
    for i in range(5):
        print(f"step {i}: loss={1.0 / (i + 1 + rank):.5f}", flush=True)
        if rank == 0:
            print(f"eval accuracy={0.5 + 0.1 * i:.2f}", flush=True)
    if rank == 0:
        config = json.load(open(os.path.join(os.environ["SM_INPUT_CONFIG_DIR"], "tensorboardoutputconfig.json")))
        writer = Writer(os.path.join(config["LocalPath"], "script"))
        for step in range(3):
            writer.add_scalar("script/lr", 0.1 * (step + 1), step)
        writer.close()
        names = os.listdir(os.path.join(config["LocalPath"], "script"))
        dest = os.path.join(config["S3OutputPath"], "script", names[0])
        deadline = time.monotonic() + 120
        while not (os.path.exists(dest) and os.path.getsize(dest) == os.path.getsize(
                os.path.join(config["LocalPath"], "script", names[0]))):
            if time.monotonic() > deadline:
                sys.exit(f"{dest} did not appear while the job ran")
            time.sleep(0.1)
        open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.txt"), "w").write("w")
        os.makedirs(os.environ["SM_OUTPUT_DATA_DIR"], exist_ok=True)
        open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "summary.txt"), "w").write("s")
"""


@pytest.fixture(scope="module", autouse=True)
def tensorflow_imported():
    """TensorBoard's file access imports TensorFlow where it is installed, and TensorFlow sets variables in the
    process as it loads: loaded before the test, so the hygiene check sees only what the test itself changes."""
    from tensorboard.compat import tf

    tf.io.gfile  # noqa: B018 - the attribute access is what loads it


def scalars(run_dir) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall time)] of the event files in ``run_dir``, as TensorBoard reads them."""
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})  # every event (it keeps 10 a tag by default)
    acc.Reload()
    return {
        tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
    }


def test_job_exports_to_tensorboard_and_mlflow(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # a test reports nothing to MLflow's telemetry
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    tb_dest = tmp_path / "tensorboard"
    db = tmp_path / "mlflow.db"
    spec = parse_spec({
        "entry_point": "train.py", "source_dir": str(src), "job_name": "exported",
        "processes_per_host": 2, "distribution": "mpi",
        "hyperparameters": {"lr": 0.1, "layers": [2, 3], "optimizer": "sgd"},
        "metric_definitions": [{"Name": "train:loss", "Regex": "loss=([0-9.]+)"},
                               {"Name": "eval:accuracy", "Regex": "accuracy=([0-9.]+)"}],
        "tensorboard_output_config": {"s3_output_path": str(tb_dest)},
        "mlflow": {"tracking_uri": f"sqlite:///{db}", "experiment": "hora-tests"},
    })
    store = JobStore(tmp_path / "home")
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason

    # the job store's series: (metric, rank) -> values in the order the rank printed them
    series: dict[tuple[str, int], list[tuple[float, float]]] = collections.defaultdict(list)
    for name, value, timestamp, _host, rank, _attempt in store.metrics("exported"):
        series[(name, rank)].append((value, timestamp))
    assert sorted(series) == [("eval:accuracy", 0), ("train:loss", 0), ("train:loss", 1)]
    assert [len(v) for v in series.values()] == [5, 5, 5]
    expected = {(name if rank == 0 else f"{name}/rank{rank}"): values for (name, rank), values in series.items()}

    # TensorBoard: the metrics as the run <job name>, beside the script's own run, at the destination
    got = scalars(tb_dest / "exported")
    system = {tag: got.pop(tag) for tag in [t for t in got if t.startswith("system/")]}
    assert sorted(got) == sorted(expected)
    # the host's system metrics too, as system/<host>/<name>, every sample the store has
    samples: dict[str, list[float]] = collections.defaultdict(list)
    for host, _t, name, value in store.iter_system_metrics("exported"):
        samples[f"system/{host}/{name}"].append(value)
    assert set(system) == set(samples) and "system/algo-1/cpu_percent" in system
    for tag, values in samples.items():
        assert [v for _, v, _ in system[tag]] == pytest.approx(values, rel=1e-6), tag
    for tag, values in expected.items():
        assert [step for step, _, _ in got[tag]] == list(range(len(values)))
        assert [v for _, v, _ in got[tag]] == pytest.approx([v for v, _ in values], rel=1e-6)  # float32
        assert [w for _, _, w in got[tag]] == pytest.approx([t for _, t in values])
    script_run = scalars(tb_dest / "script")
    assert [(s, round(v, 5)) for s, v, _ in script_run["script/lr"]] == [(0, 0.1), (1, 0.2), (2, 0.3)]

    # MLflow: one run named after the job
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("hora-tests")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "exported" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "layers": "[2, 3]", "optimizer": "sgd"}
    tags = run.data.tags
    assert (tags["hora.status"], tags["hora.secondary_status"], tags["hora.exit_code"]) == ("Completed",
                                                                                            "Completed", "0")
    assert "hora.failure_reason" not in tags and tags["mlflow.source.name"] == "train.py"
    assert run.info.start_time == int(record.started * 1000) and run.info.end_time == int(record.ended * 1000)
    assert len(client.get_metric_history(run.info.run_id, "system/algo-1/memory_used_bytes")) == len(
        samples["system/algo-1/memory_used_bytes"])
    for key, values in expected.items():
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [(m.step, m.value, m.timestamp) for m in history] == [
            (i, v, int(t * 1000)) for i, (v, t) in enumerate(values)]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"model.tar.gz", "output.tar.gz"}
    # a local store's artifacts go beside its database (not into the supervisor's current directory)
    local = tmp_path / "mlruns" / "hora-tests" / run.info.run_id / "artifacts" / "model.tar.gz"
    assert run.info.artifact_uri == str(local.parent)
    assert local.read_bytes() == Path(record.artifacts["model"]).read_bytes()
    with tarfile.open(local) as tar:
        assert tar.getnames() == ["weights.txt"]
    assert tags["hora.artifact.model"] == record.artifacts["model"]

    assert main(["job", "--home", str(store.home), "describe", "exported"]) == 0
    out = capsys.readouterr().out
    assert f"TensorBoard:       /opt/ml/output/tensorboard synced to {tb_dest} (metrics: run exported)" in out
    assert f"MLflow:            run exported in experiment 'hora-tests' at sqlite:///{db}" in out
