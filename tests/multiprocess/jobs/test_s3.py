"""S3 channels and artifact upload against a real local S3 server (moto's server mode, started by the test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3", reason="S3 channels need boto3 (the jobs extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (the test extra)")

from hora.data import PipeDataset, encode_tfrecord  # noqa: E402
from hora.errors import ChannelError, StorageError  # noqa: E402
from hora.jobs import s3  # noqa: E402
from hora.jobs.channels import stage_channel, upload  # noqa: E402
from support import paths  # noqa: E402
from support.s3_server import CREDENTIALS, free_port, moto_server  # noqa: E402

SRC = str(paths.SRC)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def bucket(endpoint, monkeypatch) -> Iterator[tuple[object, str]]:
    """A fresh bucket with a few objects; the environment points hora's S3 client at the server."""
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HORA_S3_ENDPOINT_URL", endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **_keys())
    name = f"b-{os.urandom(4).hex()}"
    client.create_bucket(Bucket=name)
    yield client, name


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _put(client, bucket: str, objects: dict[str, bytes]) -> None:
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def _contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_file_mode_from_an_s3_prefix(bucket, tmp_path):
    client, name = bucket
    objects = {f"train/part-{i}.csv": os.urandom(1000 + i) for i in range(4)}
    objects["train/sub/extra.csv"] = b"extra"
    _put(client, name, {**objects, "train/sub/": b"", "other/ignored.csv": b"no"})
    seen = []
    handle = stage_channel(
        "train",
        f"s3://{name}/train/",
        tmp_path / "train",
        input_mode="File",
        distribution="FullyReplicated",
        host_index=0,
        host_count=1,
        progress=seen.append,
    )
    expected = {k[len("train/") :]: v for k, v in objects.items()}
    assert _contents(tmp_path / "train") == expected
    assert handle.files == tuple(sorted(expected))
    total = sum(len(v) for v in objects.values())
    assert seen[-1].bytes_done == seen[-1].bytes_total == total
    assert seen[-1].files_done == 5


def test_sharded_by_s3_key_across_three_hosts(bucket, tmp_path):
    client, name = bucket
    objects = {f"data/shard-{i:02d}.rec": f"object {i}".encode() for i in range(8)}
    _put(client, name, objects)
    shards = []
    for i in range(3):
        dest = tmp_path / f"algo-{i + 1}"
        stage_channel(
            "train",
            f"s3://{name}/data",
            dest,
            input_mode="File",
            distribution="ShardedByS3Key",
            host_index=i,
            host_count=3,
        )
        shards.append(_contents(dest))
    keys = sorted(k.split("/")[1] for k in objects)
    assert [sorted(s) for s in shards] == [keys[i::3] for i in range(3)]
    merged = {k: v for s in shards for k, v in s.items()}
    assert merged == {k.split("/")[1]: v for k, v in objects.items()}


def test_an_empty_prefix_names_the_channel(bucket, tmp_path):
    _, name = bucket
    with pytest.raises(ChannelError, match=rf"channel 'eval': no objects under s3://{name}/missing/"):
        stage_channel(
            "eval",
            f"s3://{name}/missing/",
            tmp_path / "e",
            input_mode="File",
            distribution="FullyReplicated",
            host_index=0,
            host_count=1,
        )


def test_a_missing_bucket_names_the_channel(bucket, tmp_path):
    with pytest.raises(
        ChannelError, match=r"channel 'train': listing s3://no-such-bucket-x/p: not found .*NoSuchBucket"
    ):
        stage_channel(
            "train",
            "s3://no-such-bucket-x/p",
            tmp_path / "t",
            input_mode="File",
            distribution="FullyReplicated",
            host_index=0,
            host_count=1,
        )


def test_pipe_mode_streams_s3_objects_to_another_process(bucket, tmp_path):
    client, name = bucket
    records = [os.urandom(300 + i) for i in range(40)]
    _put(
        client,
        name,
        {
            "tf/a.tfrecord": b"".join(encode_tfrecord(r) for r in records[:25]),
            "tf/b.tfrecord": b"".join(encode_tfrecord(r) for r in records[25:]),
        },
    )
    data = tmp_path / "input" / "data"
    handle = stage_channel(
        "train",
        f"s3://{name}/tf/",
        data / "train",
        input_mode="Pipe",
        distribution="FullyReplicated",
        host_index=0,
        host_count=1,
    )
    code = (
        "import json, sys\n"
        "from hora.data import PipeDataset\n"
        "ds = PipeDataset('train', record_format='tfrecord', timeout=120)\n"
        "print(json.dumps([[r.hex() for r in ds] for _ in range(2)]))\n"
    )
    try:
        env = {**os.environ, "PYTHONPATH": SRC, "SM_INPUT_DIR": str(tmp_path / "input")}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [[r.hex() for r in records]] * 2
        assert not (data / "train").exists()  # Pipe mode stages nothing on disk
    finally:
        handle.close()
    assert handle.error is None


def test_pipe_mode_reports_an_object_deleted_mid_job(bucket, tmp_path):
    client, name = bucket
    _put(client, name, {"t/1.txt": b"one\n", "t/2.txt": b"two\n"})
    data = tmp_path / "data"
    handle = stage_channel(
        "train",
        f"s3://{name}/t/",
        data / "train",
        input_mode="Pipe",
        distribution="FullyReplicated",
        host_index=0,
        host_count=1,
    )
    try:
        ds = PipeDataset(data / "train", timeout=60)
        assert list(ds) == ["one", "two"]
        client.delete_object(Bucket=name, Key="t/2.txt")
        with pytest.raises(ChannelError, match=r"channel 'train'.*s3://.*t/2\.txt.*NoSuchKey"):
            list(ds)
    finally:
        handle.close()
    assert isinstance(handle.error, StorageError)


def test_upload_to_s3(bucket, tmp_path):
    client, name = bucket
    (tmp_path / "model.tar.gz").write_bytes(os.urandom(50_000))
    where = upload(tmp_path / "model.tar.gz", f"s3://{name}/jobs/j1/output")
    assert where == f"s3://{name}/jobs/j1/output/model.tar.gz"
    body = client.get_object(Bucket=name, Key="jobs/j1/output/model.tar.gz")["Body"].read()
    assert body == (tmp_path / "model.tar.gz").read_bytes()
    (tmp_path / "ckpt" / "sub").mkdir(parents=True)
    (tmp_path / "ckpt" / "sub" / "step-1.pt").write_bytes(b"weights")
    upload(tmp_path / "ckpt", f"s3://{name}/jobs/j1/")
    assert client.get_object(Bucket=name, Key="jobs/j1/ckpt/sub/step-1.pt")["Body"].read() == b"weights"


def test_upload_to_a_missing_bucket(bucket, tmp_path):
    (tmp_path / "model.tar.gz").write_bytes(b"m")
    with pytest.raises(
        StorageError, match=r"uploading .*model\.tar\.gz to s3://nope-bucket-y/out/model\.tar\.gz: not found"
    ):
        upload(tmp_path / "model.tar.gz", "s3://nope-bucket-y/out")


def test_refused_credentials_name_the_channel(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # moto checks signatures against its IAM users only when told to (from the first request on).
    with (
        moto_server(INITIAL_NO_AUTH_ACTION_COUNT="0") as url,
        pytest.raises(ChannelError, match=r"channel 'train':.*refused the request \(InvalidAccessKeyId"),
    ):
        stage_channel(
            "train",
            "s3://bucket/p",
            tmp_path / "t",
            input_mode="File",
            distribution="FullyReplicated",
            host_index=0,
            host_count=1,
            s3_endpoint_url=url,
        )


def test_missing_credentials_name_the_channel(tmp_path, monkeypatch):
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(ChannelError, match=r"channel 'train':.*no usable AWS credentials"):
        stage_channel(
            "train",
            "s3://bucket/p",
            tmp_path / "t",
            input_mode="File",
            distribution="FullyReplicated",
            host_index=0,
            host_count=1,
            s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
        )


def test_an_unreachable_endpoint_names_the_channel(tmp_path, monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ChannelError, match=rf"channel 'train':.*cannot reach {url}"):
        stage_channel(
            "train",
            "s3://bucket/p",
            tmp_path / "t",
            input_mode="File",
            distribution="FullyReplicated",
            host_index=0,
            host_count=1,
            s3_endpoint_url=url,
        )


def test_endpoint_precedence(monkeypatch):
    for name in s3.ENDPOINT_ENV:
        monkeypatch.delenv(name, raising=False)
    assert s3.resolve_endpoint_url(None) is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://c")
    assert s3.resolve_endpoint_url(None) == "http://c"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://b")
    assert s3.resolve_endpoint_url(None) == "http://b"
    monkeypatch.setenv("HORA_S3_ENDPOINT_URL", "http://a")
    assert s3.resolve_endpoint_url(None) == "http://a"
    assert s3.resolve_endpoint_url("http://explicit") == "http://explicit"


def test_a_malformed_uri_names_the_channel(tmp_path):
    with pytest.raises(ValueError, match=r"channel 'train': S3 URI 's3:///k' has no bucket"):
        stage_channel(
            "train",
            "s3:///k",
            tmp_path,
            input_mode="File",
            distribution="FullyReplicated",
            host_index=0,
            host_count=1,
        )


def test_s3_uri_parsing():
    assert s3.S3Uri.parse("s3://b/a/b/") == s3.S3Uri("b", "a/b/")
    assert s3.S3Uri.parse("s3://b") == s3.S3Uri("b", "")
    assert s3.S3Uri("b", "out/").child("m.tar.gz") == s3.S3Uri("b", "out/m.tar.gz")
    assert s3.S3Uri("b", "").child("m") == s3.S3Uri("b", "m")
    with pytest.raises(ValueError, match="no bucket"):
        s3.S3Uri.parse("s3:///key")


# -- whole jobs against the server --------------------------------------------------------------------------------
SHARD_SCRIPT = """
    import json, os
    import hora.numpy as hvd

    hvd.init()
    files = sorted(os.listdir(os.environ["SM_CHANNEL_TRAINING"]))
    everyone = hvd.allgather_object(files)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"seen-{os.environ['SM_CURRENT_HOST']}.json"), "w") as f:
        json.dump(everyone, f)
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "note.txt"), "w") as f:
        f.write("done")
"""


def test_a_job_with_a_sharded_s3_channel_and_s3_output(bucket, tmp_path):
    """Each host gets its share of the keys (together: all of them, once), and the artifacts land in S3."""
    import tarfile
    import textwrap

    from hora.jobs import JobStore, parse_spec, start_job

    client, name = bucket
    keys = {f"data/part-{i:02d}.csv": f"{i}\n".encode() for i in range(5)}
    _put(client, name, keys)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(SHARD_SCRIPT))
    spec = parse_spec({
        "entry_point": "train.py", "source_dir": str(src), "job_name": "s3-job", "instance_count": 2,
        "processes_per_host": 1, "output_path": f"s3://{name}/results",
        "inputs": {"training": {"uri": f"s3://{name}/data", "distribution": "ShardedByS3Key"}},
    })
    record = start_job(spec, JobStore(tmp_path / "home"), wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    assert record.artifacts["model"] == f"s3://{name}/results/s3-job/output/model.tar.gz", record.artifacts
    got = tmp_path / "model.tar.gz"
    client.download_file(name, "results/s3-job/output/model.tar.gz", str(got))
    with tarfile.open(got) as tar:
        seen = json.loads(tar.extractfile("seen-algo-1.json").read())  # type: ignore[union-attr]
    assert seen == [["part-00.csv", "part-02.csv", "part-04.csv"], ["part-01.csv", "part-03.csv"]]
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=name, Prefix="results/")["Contents"]}
    assert listed == {"results/s3-job/output/model.tar.gz", "results/s3-job/output/output.tar.gz"}


def test_tensorboard_files_sync_to_an_s3_prefix(bucket, tmp_path):
    """hora job's TensorBoard sync (tensorboard_output_config) with an s3:// destination: new and changed files
    are uploaded whole, nothing is deleted, and algo-1's file wins a name clash."""
    from hora.jobs.tb_export import DirectorySync

    client, name = bucket
    algo1, algo2 = tmp_path / "algo-1", tmp_path / "algo-2"
    (algo1 / "run").mkdir(parents=True)
    (algo2 / "run").mkdir(parents=True)
    (algo1 / "run" / "events").write_bytes(b"first")
    (algo2 / "run" / "events").write_bytes(b"algo-2's")
    (algo2 / "run" / "other").write_bytes(b"other")
    sync = DirectorySync([(algo1, ""), (algo2, "")], f"s3://{name}/tb/job", tmp_path / "staging")
    assert sync.sync() == 2

    def objects() -> dict[str, bytes]:
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=name, Prefix="tb/")["Contents"]]
        return {k: client.get_object(Bucket=name, Key=k)["Body"].read() for k in keys}

    assert objects() == {"tb/job/run/events": b"first", "tb/job/run/other": b"other"}
    with open(algo1 / "run" / "events", "ab") as f:
        f.write(b" and more")
    (algo2 / "run" / "other").unlink()
    assert sync.sync() == 1 and sync.sync() == 0
    assert objects() == {"tb/job/run/events": b"first and more", "tb/job/run/other": b"other"}
    assert list((tmp_path / "staging").iterdir()) == []  # the snapshots uploaded are removed


def test_mlflow_logs_artifacts_that_went_to_s3(bucket, tmp_path, monkeypatch):
    """A job whose output_path is s3://: the MLflow run still gets model.tar.gz (downloaded, then logged)."""
    pytest.importorskip("mlflow", reason="the MLflow export needs the mlflow extra")
    pytest.importorskip("sqlalchemy", reason="a SQLite MLflow store needs the mlflow extra's sqlalchemy")
    from mlflow import MlflowClient

    from hora.jobs import JobStore, parse_spec
    from hora.jobs.mlflow_export import MlflowExport
    from hora.jobs.states import JobStatus, SecondaryStatus

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    client, name = bucket
    _put(client, name, {"out/job/output/model.tar.gz": b"model bytes"})
    (tmp_path / "train.py").write_text("")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = parse_spec({"entry_point": "train.py", "job_name": "s3-artifacts", "mlflow": {"tracking_uri": uri}},
                      base_dir=tmp_path)
    assert spec.mlflow is not None
    store = JobStore(tmp_path / "home")
    store.create(spec.job_name, spec.to_dict())
    store.update(spec.job_name, started=1.0, ended=2.0, failure_reason="AlgorithmError: it broke", exit_code=3,
                 artifacts={"model": f"s3://{name}/out/job/output/model.tar.gz"})
    store.transition(spec.job_name, JobStatus.Failed, SecondaryStatus.Failed, "AlgorithmError: it broke")
    export = MlflowExport(spec.mlflow, spec)
    run_id = export.open(1.0)
    export.end(store.get(spec.job_name))
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    # the experiment MLflow makes with a new database (Default) keeps its artifacts beside it too, not in ./mlruns
    assert run.info.artifact_uri == str(tmp_path / "mlruns" / "0" / run_id / "artifacts")
    assert run.data.tags["hora.artifact.model"] == f"s3://{name}/out/job/output/model.tar.gz"
    assert (run.info.status, run.info.end_time) == ("FAILED", 2000)
    assert (run.data.tags["hora.status"], run.data.tags["hora.failure_reason"], run.data.tags["hora.exit_code"]) == (
        "Failed", "AlgorithmError: it broke", "3")
    artifact = Path(run.info.artifact_uri) / "model.tar.gz"
    assert artifact.read_bytes() == b"model bytes"
