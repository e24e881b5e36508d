"""hora.jobs.Estimator takes what SageMaker SDK scripts pass, and judges a finished job as the SDK does."""

from __future__ import annotations

import logging
import time

import pytest

from hora.errors import ConfigError, SpecError, UnexpectedStatusException
from hora.jobs import MXNet, PyTorch, TensorFlow
from hora.jobs.estimator import Estimator, _check_status, _describe
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobRecord, JobStore


@pytest.fixture
def code(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


SDK_ARGS = {
    "role": "arn:aws:iam::111122223333:role/SageMakerRole",
    "framework_version": "2.1",
    "py_version": "py310",
    "image_uri": "example.invalid/train:latest",
    "sagemaker_session": object(),
    "instance_type": "ml.c5.xlarge",
    "output_path": None,
    "volume_size": 30,
    "tags": [{"Key": "team", "Value": "ml"}],
}


@pytest.mark.parametrize("cls", [Estimator, PyTorch, TensorFlow, MXNet])
def test_sdk_arguments_are_accepted_and_the_useless_ones_named_once(cls, code, caplog):
    with caplog.at_level(logging.WARNING, logger="hora"):
        est = cls(entry_point="train.py", instance_count=1, home=str(code / "home"), **SDK_ARGS)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    for name in ("role", "framework_version", "py_version", "image_uri", "sagemaker_session", "volume_size", "tags"):
        assert name in warnings[0]
    assert est.fields["instance_type"] == "ml.c5.xlarge"
    assert isinstance(est, Estimator)


def test_sdk_v1_distributions_and_checkpoint_uri_map_onto_the_spec(code):
    est = Estimator(entry_point="train.py", instance_count=2, distributions={"mpi": {"enabled": True}},
                    checkpoint_s3_uri=str(code / "ckpt"), home=str(code / "home"))  # fmt: skip
    assert est.fields["distribution"] == {"mpi": {"enabled": True}}
    assert est.fields["checkpoint_path"] == str(code / "ckpt")
    with pytest.raises(ConfigError, match="pass either distributions or distribution"):
        Estimator(entry_point="train.py", distribution="mpi", distributions="mpi", home=str(code / "home"))


def test_unknown_arguments_are_still_a_clear_error(code):
    with pytest.raises(SpecError, match="unknown field 'hyperparams'; did you mean 'hyperparameters'"):
        Estimator(entry_point="train.py", role="r", hyperparams={"a": 1}, home=str(code / "home"))
    with pytest.raises(ConfigError, match="checkpoint_local_path"):
        Estimator(entry_point="train.py", checkpoint_local_path="/tmp/ck", home=str(code / "home"))


def test_base_job_name_prefixes_the_job_name(code):
    est = Estimator(entry_point="train.py", base_job_name="my-train", home=str(code / "home"))
    name = est._job_name()
    assert name is not None and name.startswith("my-train-")


def _record(status: JobStatus, reason: str | None = None) -> JobRecord:
    now = time.time()
    return JobRecord("job-1", status, SecondaryStatus(status.value), "/x", {"instance_count": 2, "max_run": 60,
                     "hyperparameters": {"epochs": 3}}, now, now, now, 1, reason, 1 if reason else 0, 1, False,
                     {"model": "/x/output/model.tar.gz"})  # fmt: skip


def test_a_failed_job_raises_the_sdks_exception():
    with pytest.raises(UnexpectedStatusException) as info:
        _check_status(_record(JobStatus.Failed, "AlgorithmError: host algo-1, rank 0 failed first"))
    assert str(info.value) == (
        "Error for Training job job-1: Failed. Reason: AlgorithmError: host algo-1, rank 0 failed first"
    )
    assert info.value.actual_status == "Failed" and info.value.allowed_statuses == ["Completed", "Stopped"]
    assert isinstance(info.value, ValueError)


def test_completed_passes_and_stopped_warns_as_the_sdk_does(caplog):
    _check_status(_record(JobStatus.Completed))
    with caplog.at_level(logging.WARNING, logger="hora"):
        _check_status(_record(JobStatus.Stopped))
    assert "Job ended with status 'Stopped' rather than 'Completed'" in caplog.text


def test_describe_has_the_sdks_field_names(tmp_path):
    d = _describe(JobStore(tmp_path / "home"), _record(JobStatus.Failed, "boom"))
    assert d["TrainingJobName"] == "job-1" and d["TrainingJobStatus"] == "Failed"
    assert d["FailureReason"] == "boom" and d["ModelArtifacts"] == {"S3ModelArtifacts": "/x/output/model.tar.gz"}
    assert d["HyperParameters"] == {"epochs": "3"} and d["ResourceConfig"]["InstanceCount"] == 2
    assert d["EnableManagedSpotTraining"] is False and d["StoppingCondition"] == {"MaxRuntimeInSeconds": 60}
    assert d["TrainingTimeInSeconds"] == 0 and d["BillableTimeInSeconds"] == 0  # (no Training transition here)
