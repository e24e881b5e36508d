"""The spec's export fields (tensorboard_output_config, mlflow): parsed, stored, and every mistake named at once."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hora.errors import ConfigError, SpecError, StorageError
from hora.jobs import Estimator, TensorBoardOutputConfig, load_spec, parse_spec
from hora.jobs.export_spec import MlflowConfig, describe_lines, describe_request, require
from hora.jobs.exporter import series_key
from hora.jobs.mlflow_export import mlflow_name
from hora.jobs.sagemaker_env import host_layout
from hora.jobs.spec import spec_from_dict
from hora.jobs.tb_export import DirectorySync, host_directory


@pytest.fixture
def code(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def spec(code, **fields):
    return parse_spec({"entry_point": "train.py", **fields}, base_dir=code)


def problems(code, **fields) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec(code, **fields)
    return info.value.problems


def test_nothing_is_exported_unless_asked(code):
    s = spec(code)
    assert s.tensorboard_output_config is None and s.mlflow is None


def test_a_yaml_spec_with_both_exports_round_trips_through_the_store(code):
    (code / "job.yaml").write_text(
        "entry_point: train.py\n"
        "tensorboard_output_config: {s3_output_path: tb/run-1, container_local_output_path: /opt/ml/output/tb/}\n"
        "mlflow: {tracking_uri: 'sqlite:///runs/mlflow.db', experiment: exp-1}\n"
    )
    s = load_spec(code / "job.yaml")
    assert s.tensorboard_output_config == TensorBoardOutputConfig(str(code / "tb" / "run-1"), "/opt/ml/output/tb")
    # relative paths are the spec file's: the detached supervisor runs elsewhere
    assert s.mlflow == MlflowConfig(f"sqlite:///{code}/runs/mlflow.db", "exp-1")
    back = spec_from_dict(s.to_dict())
    assert back == s
    # what describe shows (hora job describe; the Estimator's DescribeTrainingJob)
    assert describe_lines(s.to_dict()) == [
        f"TensorBoard:       /opt/ml/output/tb synced to {code}/tb/run-1 (metrics: run {s.job_name})",
        f"MLflow:            run {s.job_name} in experiment 'exp-1' at sqlite:///{code}/runs/mlflow.db",
    ]
    assert describe_request(s.to_dict()) == {
        "TensorBoardOutputConfig": {"S3OutputPath": f"{code}/tb/run-1", "LocalPath": "/opt/ml/output/tb"}}
    assert describe_lines(spec(code).to_dict()) == [] and describe_request(spec(code).to_dict()) == {}


def test_sagemaker_shapes_are_accepted(code):
    # hora's class, with the SDK's names and default
    tb = TensorBoardOutputConfig("s3://bucket/tb")
    assert tb.local_path == "/opt/ml/output/tensorboard"
    assert tb._to_request_dict() == {"S3OutputPath": "s3://bucket/tb"}
    assert spec(code, tensorboard_output_config=tb).tensorboard_output_config == tb
    # the SDK v2 object's attributes, the v3 ModelTrainer config's (local_path), a bare destination
    v2 = SimpleNamespace(s3_output_path="s3://bucket/a", container_local_output_path="/opt/ml/output/tb2")
    assert spec(code, tensorboard_output_config=v2).tensorboard_output_config == TensorBoardOutputConfig(
        "s3://bucket/a", "/opt/ml/output/tb2")
    v3 = SimpleNamespace(s3_output_path="s3://bucket/b", local_path="/opt/ml/output/tb3")
    assert spec(code, tensorboard_output_config=v3).tensorboard_output_config.local_path == "/opt/ml/output/tb3"
    assert spec(code, tensorboard_output_config="out/tb").tensorboard_output_config == TensorBoardOutputConfig(
        str(code / "out" / "tb"))


def test_the_estimator_passes_tensorboard_output_config_on_and_no_longer_calls_it_useless(code, caplog):
    with caplog.at_level(logging.WARNING, logger="hora"):
        est = Estimator(entry_point=str(code / "train.py"), home=str(code / "home"),
                        tensorboard_output_config=TensorBoardOutputConfig(str(code / "tb")),
                        mlflow={"tracking_uri": f"sqlite:///{code}/m.db"})
    assert caplog.records == []
    assert est.fields["tensorboard_output_config"] == TensorBoardOutputConfig(str(code / "tb"))
    with pytest.raises(SpecError, match="tensorboard_output_config needs s3_output_path"):
        Estimator(entry_point=str(code / "train.py"), home=str(code / "home"), tensorboard_output_config={})


def test_every_mistake_is_named_at_once(code):
    got = problems(
        code,
        tensorboard_output_config={"s3_output_path": "gs://bucket/tb", "container_local_path": "/x",
                                   "local_path": "relative/dir"},
        mlflow={"tracking_uri": 5, "experimnet": "e"},
    )
    assert got == [
        "unknown field 'container_local_path' in tensorboard_output_config; did you mean "
        "'container_local_output_path'?",
        "container_local_output_path 'relative/dir' of tensorboard_output_config must be an absolute path in the "
        "container, e.g. /opt/ml/output/tensorboard",
        "unknown field 'experimnet' in mlflow; did you mean 'experiment'?",
        "tracking_uri of mlflow must be a string, got 5 (int)",
        "mlflow needs a tracking_uri (e.g. sqlite:///mlflow.db or http://host:5000), or MLFLOW_TRACKING_URI set in "
        "the environment",
    ]
    assert problems(code, tensorboard_output_config={"s3_output_path": "gs://bucket/tb"}) == [
        "s3_output_path of tensorboard_output_config 'gs://bucket/tb' is neither an s3:// URI nor a local directory"]
    assert problems(code, tensorboard_output_config={"s3_output_path": "s3:///tb"}) == [
        "s3_output_path of tensorboard_output_config 's3:///tb' has no bucket; write s3://bucket/prefix or a local "
        "directory"]
    assert "needs s3_output_path" in problems(code, tensorboard_output_config={"container_local_output_path": "/a"})[0]
    assert "must be a mapping with s3_output_path" in problems(code, tensorboard_output_config=3)[0]
    assert "must be a mapping with tracking_uri and experiment, true or false, got list" in problems(
        code, mlflow=["x"])[0]


def test_a_destination_overlapping_a_shared_local_path_is_refused(code):
    assert problems(code, tensorboard_output_config={"s3_output_path": str(code / "tb" / "copy"),
                                                     "container_local_output_path": str(code / "tb")}) == [
        f"s3_output_path {code}/tb/copy and container_local_output_path {code}/tb of tensorboard_output_config "
        "overlap: the sync would copy its own copies forever; keep them apart"]


@pytest.mark.parametrize("local", ["/opt/ml", "/opt/ml/", "/opt/ml/input", "/opt/ml/code", "/opt/ml/output", "/"])
def test_a_local_path_that_would_sync_a_whole_tree_is_refused(code, local):
    assert problems(code, tensorboard_output_config={"s3_output_path": "s3://b/tb",
                                                     "container_local_output_path": local}) == [
        f"container_local_output_path {local!r} of tensorboard_output_config would sync a whole tree (code, input "
        "data, output); name a directory of its own, e.g. /opt/ml/output/tensorboard"]


def test_mlflow_tracking_uri_from_the_environment_and_its_opt_out(code, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert spec(code).mlflow == MlflowConfig("http://mlflow.example:5000", "Default")
    assert spec(code, mlflow={"experiment": "e"}).mlflow == MlflowConfig("http://mlflow.example:5000", "e")
    assert spec(code, mlflow={"tracking_uri": "sqlite:////abs/m.db"}).mlflow.tracking_uri == "sqlite:////abs/m.db"
    assert spec(code, mlflow=False).mlflow is None
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert "mlflow needs a tracking_uri" in problems(code, mlflow=True)[0]


def test_a_missing_extra_is_one_error_naming_the_install(code, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an uninstalled package looks like to import
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/m.db")
    assert problems(code, tensorboard_output_config="s3://b/tb") == [
        "tensorboard_output_config needs the tensorboard package, which is not installed: "
        "pip install -c constraints.txt -e '.[tensorboard]' in hora's checkout",
        "exporting the job to MLflow (MLFLOW_TRACKING_URI='sqlite:////tmp/m.db' (set mlflow: false to leave it out)) "
        "needs the mlflow package, which is not installed: pip install -c constraints.txt -e '.[mlflow]' in hora's "
        "checkout",
    ]
    assert spec(code, mlflow=False).mlflow is None  # the way out it names
    with pytest.raises(ConfigError, match=r"needs the tensorboard package .*-e '\.\[tensorboard\]' in hora's checkout"):
        require("tensorboard")


def test_series_names_and_mlflow_keys():
    assert series_key("train:loss", 0) == "train:loss"
    assert series_key("train:loss", 3) == "train:loss/rank3"
    assert mlflow_name("val loss (top-1) %") == "val loss _top-1_ _"


def test_host_directories_are_on_each_hosts_tree(tmp_path):
    layout = host_layout(tmp_path, "algo-2")
    assert host_directory(TensorBoardOutputConfig("s3://b/x"), layout) == layout.root / "output" / "tensorboard"
    assert host_directory(TensorBoardOutputConfig("s3://b/x", "/opt/ml/tb"), layout) == layout.root / "tb"
    # outside /opt/ml: this machine's path, shared by every host
    assert host_directory(TensorBoardOutputConfig("s3://b/x", "/data/tb"), layout) == Path("/data/tb")


def test_directory_sync_adds_appends_replaces_and_never_deletes(tmp_path):
    a, b, dest = tmp_path / "a", tmp_path / "b", tmp_path / "dest"
    (a / "run").mkdir(parents=True)
    b.mkdir()
    (a / "run" / "events").write_bytes(b"one")
    (b / "run").mkdir()
    (b / "run" / "events").write_bytes(b"from b")  # the same name on a later host: the first host's wins
    (b / "only-b").write_bytes(b"b")
    (a / "link").symlink_to("/etc/hostname")
    sync = DirectorySync([(a, ""), (b, "")], str(dest), tmp_path / "staging")
    assert sync.sync() == 2
    assert (dest / "run" / "events").read_bytes() == b"one" and (dest / "only-b").read_bytes() == b"b"
    assert not (dest / "link").exists()  # a link would copy what it points to
    assert sync.sync() == 0
    inode = (dest / "run" / "events").stat().st_ino
    with open(a / "run" / "events", "ab") as f:
        f.write(b" two")
    assert sync.sync() == 1
    assert (dest / "run" / "events").read_bytes() == b"one two"
    assert (dest / "run" / "events").stat().st_ino == inode  # grown in place: a reader following it sees more
    (a / "run" / "events").write_bytes(b"new")  # rewritten shorter: replaced whole
    (b / "only-b").unlink()
    assert sync.sync() == 1
    assert (dest / "run" / "events").read_bytes() == b"new" and (dest / "only-b").read_bytes() == b"b"
    assert sorted(p.name for p in dest.rglob("*")) == ["events", "only-b", "run"]  # no partial copies left


def test_directory_sync_names_the_destination_that_refuses(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x")
    (tmp_path / "blocked").write_bytes(b"a file where the destination directory should be")
    sync = DirectorySync([(tmp_path / "a", "")], str(tmp_path / "blocked"), tmp_path / "staging")
    with pytest.raises(StorageError, match=r"syncing TensorBoard files to .*blocked failed for 1 file"):
        sync.sync()
