"""MLflow export of a job: one run named after the job, with MLflow's own client (``MlflowClient``).

Hyperparameters are the run's params; each parsed metric value is logged with its step (see
:func:`hora.jobs.exporter.series_key`); when the job ends its status, secondary status, failure reason and exit
code become tags, the run is terminated (Completed: FINISHED, Failed: FAILED, Stopped: KILLED), and
``model.tar.gz`` and ``output.tar.gz`` are logged as the run's artifacts (downloaded first when they went to S3).
"""

from __future__ import annotations

import getpass
import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hora.jobs import s3
from hora.jobs.export_spec import MlflowConfig, require
from hora.jobs.spec import JobSpec
from hora.jobs.store import JobRecord

__all__ = ["RUN_STATUS", "MlflowExport", "mlflow_name"]

#: A job's status -> the MLflow run's.
RUN_STATUS = {"Completed": "FINISHED", "Failed": "FAILED", "Stopped": "KILLED"}
MAX_PARAM_LENGTH = 6000  # MLflow's MAX_PARAM_VAL_LENGTH
MAX_TAG_LENGTH = 5000  # below MLflow's 8000 for tags, as some stores have less
BATCH = 1000  # MLflow's MAX_METRICS_PER_BATCH
_INVALID = re.compile(r"[^\w.\- :/]")  # MLflow's valid names: word characters, '.', '-', ' ', ':', '/'


def mlflow_name(name: str) -> str:
    """``name`` as MLflow accepts a metric or param key: any other character becomes ``_``."""
    return _INVALID.sub("_", name)[:250] or "_"


def _sqlite_file(config: MlflowConfig) -> Path | None:
    uri = config.tracking_uri
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def artifact_root(config: MlflowConfig) -> str | None:
    """Where a new experiment of a local store keeps its artifacts: ``mlruns/<experiment>`` beside the database
    (MLflow's own default is ``./mlruns`` in the current directory, which for a detached supervisor is nobody's
    choice); a tracking server (``http://``, ``databricks``...) chooses for itself (None)."""
    database = _sqlite_file(config)
    if database is None:
        return None
    return str(database.parent / "mlruns" / mlflow_name(config.experiment).replace("/", "_"))


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MlflowExport:
    """The job's MLflow run; every call may raise what MLflow raises (the exporter reports it)."""

    def __init__(self, config: MlflowConfig, spec: JobSpec) -> None:
        require("mlflow")
        from mlflow import MlflowClient

        self.config = config
        self.spec = spec
        database = _sqlite_file(config)
        if database is not None and not database.exists():
            # Made here, with its artifact root beside it: MlflowClient would make it with ./mlruns (the current
            # directory's) as the root of its Default experiment.
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            database.parent.mkdir(parents=True, exist_ok=True)
            SqlAlchemyStore(config.tracking_uri, str(database.parent / "mlruns"))
        self.client = MlflowClient(tracking_uri=config.tracking_uri)
        self.run_id: str | None = None

    def open(self, started: float | None) -> str:
        """The run, created (with its params and first tags) on the first call."""
        if self.run_id is not None:
            return self.run_id
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(self.config.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = self.client.create_experiment(self.config.experiment,
                                                              artifact_location=artifact_root(self.config))
            except MlflowException:  # another job's supervisor created it meanwhile
                experiment = self.client.get_experiment_by_name(self.config.experiment)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        spec = self.spec
        tags = {
            "mlflow.source.name": spec.entry_point,
            "mlflow.source.type": "JOB",
            "hora.job_name": spec.job_name,
            "hora.status": "InProgress",
            "hora.instance_count": str(spec.instance_count),
            "hora.processes_per_host": str(spec.processes_per_host),
            "hora.distribution": spec.strategy,
        }
        try:
            tags["mlflow.user"] = getpass.getuser()
        except (KeyError, OSError):
            pass
        run = self.client.create_run(experiment_id, start_time=None if started is None else int(started * 1000),
                                     tags=tags, run_name=spec.job_name)
        self.run_id = str(run.info.run_id)
        params = [Param(mlflow_name(str(k)), _text(v, MAX_PARAM_LENGTH)) for k, v in spec.hyperparameters.items()]
        for i in range(0, len(params), 100):  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
            self.client.log_batch(self.run_id, params=params[i: i + 100])
        return self.run_id

    def metrics(self, points: Sequence[tuple[str, float, int, float]]) -> None:
        """(key, value, step, timestamp) points."""
        from mlflow.entities import Metric

        assert self.run_id is not None
        metrics = [Metric(mlflow_name(k), v, int(t * 1000), s) for k, v, s, t in points]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i: i + BATCH])

    def end(self, record: JobRecord) -> None:
        """The job's end: tags, artifacts, the run's status and end time."""
        from mlflow.entities import RunTag

        assert self.run_id is not None
        tags = {"hora.status": str(record.status), "hora.secondary_status": str(record.secondary_status),
                "hora.attempts": str(record.attempts)}
        if record.failure_reason:
            tags["hora.failure_reason"] = _text(record.failure_reason, MAX_TAG_LENGTH)
        if record.exit_code is not None:
            tags["hora.exit_code"] = str(record.exit_code)
        for kind, where in sorted(record.artifacts.items()):
            tags[f"hora.artifact.{kind}"] = _text(where, MAX_TAG_LENGTH)
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        for where in sorted(record.artifacts.values()):
            self._log_artifact(where)
        end = int(record.ended * 1000) if record.ended is not None else None
        self.client.set_terminated(self.run_id, RUN_STATUS.get(str(record.status), "FAILED"), end_time=end)

    def _log_artifact(self, where: str) -> None:
        assert self.run_id is not None
        if not s3.is_s3_uri(where):
            self.client.log_artifact(self.run_id, where)
            return
        uri = s3.S3Uri.parse(where)
        with tempfile.TemporaryDirectory(prefix="hora-mlflow-") as tmp:
            local = Path(tmp) / Path(uri.prefix).name
            client = s3.make_client()
            with s3.translate_errors(f"downloading {where} for MLflow", client):
                client.download_file(uri.bucket, uri.prefix, str(local))
            self.client.log_artifact(self.run_id, str(local))
