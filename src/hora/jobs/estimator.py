"""SageMaker SDK's ``Estimator`` (and the ``PyTorch``, ``TensorFlow`` and ``MXNet`` framework estimators), run by
hora on this machine, with the SDK's call shapes and failure semantics:

- ``fit(inputs, wait=True, logs=True, job_name=None)`` runs the job; when it ends ``Failed`` it raises
  :class:`~hora.errors.UnexpectedStatusException` carrying the status and the failure reason, as the SDK does; a
  ``Stopped`` job is logged as a warning, as the SDK does (``_check_job_status`` allows Completed and Stopped).
  With ``logs`` the ranks' output is streamed while waiting.
- ``model_data``, ``latest_training_job`` (``.name``, ``.describe()``, ``.wait()``, ``.stop()``) and ``logs()``.
- Every SDK constructor argument a SageMaker script passes is accepted; those that mean nothing on one machine
  (``role``, ``framework_version``, ``image_uri``, ``sagemaker_session``...) are named once in a warning. An
  argument neither the SDK nor hora knows is a SpecError naming it (with the closest field it may have meant).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from hora.errors import ConfigError, UnexpectedStatusException
from hora.jobs import views
from hora.jobs.api import start_job, stop_job, wait_job
from hora.jobs.export_spec import describe_request
from hora.jobs.profiler import estimator_profiler_config
from hora.jobs.spec import FIELDS, parse_spec
from hora.jobs.spot import billable_seconds
from hora.jobs.states import JobStatus
from hora.jobs.store import JobRecord, JobStore

__all__ = ["Estimator", "MXNet", "PyTorch", "TensorFlow", "TrainingJob"]

log = logging.getLogger("hora")

#: SDK arguments that have no effect when the job runs on this machine (accepted so SDK scripts run unchanged).
NO_EFFECT = (
    "role",
    "framework_version",
    "py_version",
    "image_uri",
    "image_name",
    "sagemaker_session",
    "tags",
    "volume_size",
    "volume_kms_key",
    "output_kms_key",
    "subnets",
    "security_group_ids",
    "model_uri",
    "model_channel_name",
    "enable_network_isolation",
    "encrypt_inter_container_traffic",
    "debugger_hook_config",
    "rules",
    "code_location",
    "container_log_level",
    "keep_alive_period_in_seconds",
    "enable_sagemaker_metrics",
    "train_instance_type",
    "train_volume_size",
    "train_max_run",
    "script_mode",
    "region",
)
#: SDK arguments hora maps onto its own spec fields.
RENAMED = {
    "checkpoint_s3_uri": "checkpoint_path",
    "distributions": "distribution",  # the SDK v1 spelling
    "train_instance_count": "instance_count",  # SDK v1
    "max_retry_attempts": "max_retry_attempts",
    "train_use_spot_instances": "use_spot_instances",  # SDK v1
    "train_max_wait": "max_wait",  # SDK v1
}
def _describe(store: JobStore, record: JobRecord) -> dict[str, Any]:
    """A job as the SDK's ``DescribeTrainingJob`` names it (the fields a local job has)."""
    spec = record.spec
    out: dict[str, Any] = {
        "TrainingJobName": record.name,
        "TrainingJobStatus": str(record.status),
        "SecondaryStatus": str(record.secondary_status),
        "HyperParameters": {str(k): str(v) for k, v in (spec.get("hyperparameters") or {}).items()},
        "ResourceConfig": {"InstanceType": spec.get("instance_type"), "InstanceCount": spec.get("instance_count")},
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.get("max_run")},
        "CreationTime": record.created,
        "EnableManagedSpotTraining": bool(spec.get("use_spot_instances")),
    }
    if spec.get("max_wait") is not None:
        out["StoppingCondition"]["MaxWaitTimeInSeconds"] = spec["max_wait"]
    if spec.get("checkpoint_path"):
        out["CheckpointConfig"] = {"S3Uri": spec["checkpoint_path"], "LocalPath": "/opt/ml/checkpoints"}
    out.update(describe_request(spec))
    if record.started is not None:  # as the service: whole seconds; billable = the time spent training
        out["TrainingTimeInSeconds"] = int((record.ended or time.time()) - record.started)
        out["BillableTimeInSeconds"] = int(billable_seconds(store.transitions(record.name), record.ended))
    steps = store.transitions(record.name)
    out["SecondaryStatusTransitions"] = [
        {"Status": secondary, "StartTime": when, "StatusMessage": message}
        | ({"EndTime": steps[i + 1][0]} if i + 1 < len(steps) else {})
        for i, (when, _status, secondary, message) in enumerate(steps)
    ]
    if record.started is not None:
        out["TrainingStartTime"] = record.started
    if record.ended is not None:
        out["TrainingEndTime"] = record.ended
    if record.failure_reason:
        out["FailureReason"] = record.failure_reason
    if record.artifacts.get("model"):
        out["ModelArtifacts"] = {"S3ModelArtifacts": record.artifacts["model"]}
    return out


def _check_status(record: JobRecord) -> None:
    """The SDK's ``_check_job_status``: Completed is fine, Stopped a warning, anything else raises."""
    if record.status is JobStatus.Stopped:
        log.warning(
            "Job ended with status 'Stopped' rather than 'Completed'. This could mean the job timed out or stopped "
            "early for some other reason: Consider checking whether it completed as you expect."
        )
    elif record.status is not JobStatus.Completed:
        reason = record.failure_reason or "(No reason provided)"
        raise UnexpectedStatusException(
            f"Error for Training job {record.name}: {record.status}. Reason: {reason}",
            allowed_statuses=["Completed", "Stopped"],
            actual_status=str(record.status),
        )


class TrainingJob:
    """``estimator.latest_training_job``: the SDK's ``_TrainingJob`` for a job of this machine's store."""

    def __init__(self, store: JobStore, name: str) -> None:
        self._store = store
        self.name = self.job_name = name

    def describe(self) -> dict[str, Any]:
        return _describe(self._store, self._store.get(self.name))

    def wait(self, logs: bool | str = True) -> None:
        """Wait for the job (printing its logs with ``logs``); raise UnexpectedStatusException if it failed."""
        if logs and logs != "None":
            for line in views.follow_logs(self._store, self.name):
                print(line, flush=True)
        _check_status(wait_job(self._store, self.name))

    def stop(self) -> None:
        stop_job(self._store, self.name)


class Estimator:
    """SageMaker's ``Estimator``, run by hora on this machine.

    >>> est = Estimator(entry_point="train.py", source_dir="src", role="arn:...", instance_count=2,
    ...                 instance_type="ml.c5.xlarge", processes_per_host=2,
    ...                 distribution={"mpi": {"enabled": True}}, hyperparameters={"epochs": 3})
    >>> est.fit({"training": "data/"})          # doctest: +SKIP
    >>> est.model_data                          # doctest: +SKIP
    '/home/me/.hora/jobs/train-.../output/model.tar.gz'

    Keywords: the spec's fields (docs/jobs.md), the SDK's arguments (see the module's docstring) and ``home`` (the
    job store, default ``~/.hora``). Relative paths are relative to the current directory.
    """

    def __init__(self, home: str | None = None, base_job_name: str | None = None, **kwargs: Any) -> None:
        fields: dict[str, Any] = {}
        ignored = []
        profiler = estimator_profiler_config(kwargs.pop("profiler_config", None), kwargs.pop("disable_profiler", None))
        if profiler is not None:
            fields["profiler_config"] = profiler
        for key, value in kwargs.items():
            if key in NO_EFFECT:
                ignored.append(key)
            elif key in RENAMED:
                if RENAMED[key] in fields and key != RENAMED[key]:
                    raise ConfigError(f"pass either {key} or {RENAMED[key]}, not both")
                fields[RENAMED[key]] = value
            elif key in FIELDS:
                fields[key] = value
            elif key == "checkpoint_local_path":
                if value not in (None, "/opt/ml/checkpoints"):
                    raise ConfigError(
                        f"checkpoint_local_path={value!r}: hora job puts checkpoints in each host's checkpoints/ "
                        "directory (SM's /opt/ml/checkpoints); leave it at its default"
                    )
            else:  # the spec's check names it ("unknown field 'hyperparams'; did you mean 'hyperparameters'?")
                fields[key] = value
        if ignored:
            log.warning("hora job runs on this machine: %s have no effect here", ", ".join(sorted(ignored)))
        self.fields = fields
        self.base_job_name = base_job_name
        self.store = JobStore(home)
        self.latest_job: JobRecord | None = None
        self.latest_training_job: TrainingJob | None = None
        parse_spec({**fields, "inputs": None})  # fail early on everything but the inputs

    def _job_name(self) -> str | None:
        if self.base_job_name is None:
            return None
        return f"{self.base_job_name[:40]}-{time.strftime('%Y-%m-%d-%H-%M-%S')}-{int(time.time() * 1000) % 1000:03d}"

    def fit(
        self,
        inputs: str | Mapping[str, Any] | None = None,
        wait: bool = True,
        logs: bool | str = True,
        job_name: str | None = None,
        experiment_config: Any = None,
    ) -> JobRecord:
        """Run the job with ``inputs`` (a path or URI for the ``training`` channel, or channel -> source). With
        ``wait``, block until it ends, streaming its logs when ``logs``, and raise UnexpectedStatusException if it
        failed (as the SDK). Returns the job's record (the SDK returns None; scripts that ignore it are unchanged)."""
        data = dict(self.fields)
        if inputs is not None:
            data["inputs"] = {"training": inputs} if isinstance(inputs, str) else dict(inputs)
        name = job_name or self._job_name()
        if name is not None:
            data["job_name"] = name
        spec = parse_spec(data, source="the Estimator")
        echo = bool(logs) and logs != "None"
        progress = (lambda m: print(f"hora job: {m}", flush=True)) if echo else None
        self.latest_job = start_job(spec, self.store, wait=wait, echo=echo, progress=progress)
        self.latest_training_job = TrainingJob(self.store, spec.job_name)
        if wait:
            _check_status(self.latest_job)
        return self.latest_job

    @property
    def model_data(self) -> str | None:
        """Where the last job's model.tar.gz went."""
        if self.latest_job is None:
            return None
        return self.store.get(self.latest_job.name).artifacts.get("model")

    def logs(self) -> None:
        """Print the last job's logs, following them until it ends (the SDK's ``Estimator.logs``)."""
        if self.latest_training_job is None:
            raise ConfigError("no job has been started with this estimator yet: call fit() first")
        for line in views.follow_logs(self.store, self.latest_training_job.name):
            print(line, flush=True)


class PyTorch(Estimator):
    """The SDK's ``sagemaker.pytorch.PyTorch``: an Estimator (``framework_version``/``py_version`` have no effect)."""


class TensorFlow(Estimator):
    """The SDK's ``sagemaker.tensorflow.TensorFlow``: an Estimator (``framework_version``/``py_version`` have no
    effect)."""


class MXNet(Estimator):
    """The SDK's ``sagemaker.mxnet.MXNet``: an Estimator (``framework_version``/``py_version`` have no effect)."""
