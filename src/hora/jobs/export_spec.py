"""The spec's export fields: ``tensorboard_output_config`` (SageMaker's ``TensorBoardOutputConfig``) and
``mlflow`` (``{tracking_uri, experiment}``, or ``$MLFLOW_TRACKING_URI``). The exporter that acts on them is
:mod:`hora.jobs.exporter`; docs/jobs.md, "TensorBoard and MLflow", says what each does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora.config.variables import read
from hora.errors import ConfigError
from hora.jobs.checks import Checker, type_name, unknown_field

__all__ = [
    "DEFAULT_TENSORBOARD_LOCAL_PATH",
    "EXPORT_FIELDS",
    "MlflowConfig",
    "TensorBoardOutputConfig",
    "describe_lines",
    "describe_request",
    "export_from_dict",
    "export_to_dict",
    "parse_exports",
    "require",
]

#: Where SageMaker's containers (and hora job's hosts) expect the script's TensorBoard files.
DEFAULT_TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
DEFAULT_EXPERIMENT = "Default"  # MLflow's own default experiment (id 0)
EXPORT_FIELDS = ("tensorboard_output_config", "mlflow")
_TB_KEYS = ("s3_output_path", "container_local_output_path", "local_path")
_MLFLOW_KEYS = ("tracking_uri", "experiment")
#: Inside a host's tree, these may not be synced: the whole tree, or a tree holding the code and input data.
_REFUSED_LOCAL = ("/", "/opt", "/opt/ml", "/opt/ml/input", "/opt/ml/code", "/opt/ml/output")
_EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}


@dataclass(frozen=True)
class TensorBoardOutputConfig:
    """SageMaker's ``sagemaker.debugger.TensorBoardOutputConfig``: what the script writes under
    ``container_local_output_path`` (default ``/opt/ml/output/tensorboard``, on each host's tree) is synced to
    ``s3_output_path`` (an ``s3://`` URI or, in hora, a local directory) while the job runs.

    >>> TensorBoardOutputConfig("s3://bucket/tb/job-1").local_path
    '/opt/ml/output/tensorboard'
    """

    s3_output_path: str
    container_local_output_path: str | None = None

    @property
    def local_path(self) -> str:
        """The path in the container (SageMaker's ``LocalPath``)."""
        return self.container_local_output_path or DEFAULT_TENSORBOARD_LOCAL_PATH

    def _to_request_dict(self) -> dict[str, str]:
        """The SDK's CreateTrainingJob form (``S3OutputPath``, ``LocalPath``)."""
        out = {"S3OutputPath": self.s3_output_path}
        if self.container_local_output_path is not None:
            out["LocalPath"] = self.container_local_output_path
        return out


@dataclass(frozen=True)
class MlflowConfig:
    """Each job becomes one run of ``experiment`` at ``tracking_uri``."""

    tracking_uri: str
    experiment: str = DEFAULT_EXPERIMENT


def require(module: str) -> Any:
    """Import ``module`` (``tensorboard`` or ``mlflow``), or one error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"exporting a job to {module} needs the {module} package ({exc}): "
                          f"pip install -c constraints.txt -e '.[{_EXTRAS[module]}]' in hora's checkout") from None


def _missing(module: str, why: str) -> str | None:
    if importlib.util.find_spec(module) is not None:
        return None
    return (f"{why} needs the {module} package, which is not installed: "
            f"pip install -c constraints.txt -e '.[{_EXTRAS[module]}]' in hora's checkout")


def _destination(value: str, base: Path, what: str, c: Checker) -> str | None:
    if value.startswith("s3://"):
        if not value[len("s3://"):].split("/", 1)[0]:
            c.add(f"{what} {value!r} has no bucket; write s3://bucket/prefix or a local directory")
            return None
        return value
    if "://" in value:
        c.add(f"{what} {value!r} is neither an s3:// URI nor a local directory")
        return None
    return str((base / os.path.expanduser(value)).resolve())


def _tensorboard(value: Any, base: Path, c: Checker) -> TensorBoardOutputConfig | None:
    where = "tensorboard_output_config"
    if value is None or value is False:
        return None
    if isinstance(value, (str, os.PathLike)):
        fields: Mapping[str, Any] = {"s3_output_path": os.fspath(value)}
    elif isinstance(value, Mapping):
        fields = value
        for key in fields:
            if key not in _TB_KEYS:
                c.add(unknown_field(str(key), _TB_KEYS[:2], f" in {where}"))
    elif hasattr(value, "s3_output_path"):  # the SDK's own TensorBoardOutputConfig (v2), or its v3 shape
        v2 = hasattr(value, "container_local_output_path")
        local = value.container_local_output_path if v2 else getattr(value, "local_path", None)
        fields = {"s3_output_path": value.s3_output_path, "container_local_output_path": local}
    else:
        c.add(f"{where} must be a mapping with s3_output_path (and container_local_output_path), a "
              f"TensorBoardOutputConfig or a destination string, got {type_name(value)}")
        return None
    dest = c.str_(fields, "s3_output_path", f" of {where}")
    if not dest:
        c.add(f"{where} needs s3_output_path: where the TensorBoard files go (an s3:// URI or a local directory)")
        return None
    local = c.str_(fields, "container_local_output_path", f" of {where}") or c.str_(fields, "local_path",
                                                                                    f" of {where}")
    if local is not None:
        norm = os.path.normpath(local)
        if not os.path.isabs(local):
            c.add(f"container_local_output_path {local!r} of {where} must be an absolute path in the container, "
                  f"e.g. {DEFAULT_TENSORBOARD_LOCAL_PATH}")
            return None
        if norm in _REFUSED_LOCAL:
            c.add(f"container_local_output_path {local!r} of {where} would sync a whole tree (code, input data, "
                  f"output); name a directory of its own, e.g. {DEFAULT_TENSORBOARD_LOCAL_PATH}")
            return None
        local = norm
    where_to = _destination(dest, base, f"s3_output_path of {where}", c)
    shared = local if local is not None and not local.startswith("/opt/ml/") else None  # this machine's own path
    if where_to and shared and not where_to.startswith("s3://") and (
            Path(where_to).is_relative_to(shared) or Path(shared).is_relative_to(where_to)):
        c.add(f"s3_output_path {where_to} and container_local_output_path {shared} of {where} overlap: the sync "
              "would copy its own copies forever; keep them apart")
        where_to = None
    problem = _missing("tensorboard", where)
    if problem:
        c.add(problem)
    return TensorBoardOutputConfig(where_to, local) if where_to else None


def _tracking_uri(uri: str, base: Path) -> str:
    """A local tracking URI made absolute: the detached supervisor does not run in the spec's directory."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str((base / uri[len("sqlite:///"):]).resolve())
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + str((base / uri[len("file:"):]).resolve())
    if "://" not in uri and not uri.startswith("file:"):
        return str((base / os.path.expanduser(uri)).resolve())
    return uri


def _mlflow(value: Any, base: Path, c: Checker) -> MlflowConfig | None:
    if value is False:
        return None
    from_env = read("MLFLOW_TRACKING_URI")
    if value is None:
        if not from_env:
            return None
        value, why = {}, f"MLFLOW_TRACKING_URI={from_env!r} (set mlflow: false to leave it out)"
    elif value is True:
        value, why = {}, "mlflow: true"
    else:
        why = "mlflow"
    if not isinstance(value, Mapping):
        c.add(f"mlflow must be a mapping with tracking_uri and experiment, true or false, got {type_name(value)}")
        return None
    for key in value:
        if key not in _MLFLOW_KEYS:
            c.add(unknown_field(str(key), _MLFLOW_KEYS, " in mlflow"))
    uri = c.str_(value, "tracking_uri", " of mlflow") or from_env
    experiment = c.str_(value, "experiment", " of mlflow") or DEFAULT_EXPERIMENT
    if not uri:
        c.add("mlflow needs a tracking_uri (e.g. sqlite:///mlflow.db or http://host:5000), or MLFLOW_TRACKING_URI "
              "set in the environment")
        return None
    problem = _missing("mlflow", f"exporting the job to MLflow ({why})")
    if problem:
        c.add(problem)
    return MlflowConfig(_tracking_uri(uri, base), experiment)


def parse_exports(data: Mapping[str, Any], base: Path, c: Checker) -> dict[str, Any]:
    """The JobSpec fields of ``data``'s export settings (problems go to ``c``)."""
    return {
        "tensorboard_output_config": _tensorboard(data.get("tensorboard_output_config"), base, c),
        "mlflow": _mlflow(data.get("mlflow"), base, c),
    }


def export_to_dict(tensorboard: TensorBoardOutputConfig | None, mlflow: MlflowConfig | None) -> dict[str, Any]:
    """The JSON-able form kept in the job store."""
    return {
        "tensorboard_output_config": None if tensorboard is None else tensorboard.__dict__,
        "mlflow": None if mlflow is None else mlflow.__dict__,
    }


def export_from_dict(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Back from :func:`export_to_dict` (a spec stored before these fields existed has neither)."""
    tb, ml = fields.get("tensorboard_output_config"), fields.get("mlflow")
    return {
        "tensorboard_output_config": None if tb is None else TensorBoardOutputConfig(**tb),
        "mlflow": None if ml is None else MlflowConfig(**ml),
    }


def describe_lines(spec: Mapping[str, Any]) -> list[str]:
    """``hora job describe``'s lines for the exports of a stored spec (:meth:`JobSpec.to_dict`)."""
    lines = []
    tb, ml = spec.get("tensorboard_output_config"), spec.get("mlflow")
    if tb:
        local = tb.get("container_local_output_path") or DEFAULT_TENSORBOARD_LOCAL_PATH
        lines.append(f"TensorBoard:       {local} synced to {tb['s3_output_path']} (metrics: run {spec['job_name']})")
    if ml:
        lines.append(f"MLflow:            run {spec['job_name']} in experiment {ml['experiment']!r} at "
                     f"{ml['tracking_uri']}")
    return lines


def describe_request(spec: Mapping[str, Any]) -> dict[str, Any]:
    """DescribeTrainingJob's ``TensorBoardOutputConfig`` of a stored spec, when it has one."""
    tb = spec.get("tensorboard_output_config")
    if not tb:
        return {}
    local = tb.get("container_local_output_path") or DEFAULT_TENSORBOARD_LOCAL_PATH
    return {"TensorBoardOutputConfig": {"S3OutputPath": tb["s3_output_path"], "LocalPath": local}}
