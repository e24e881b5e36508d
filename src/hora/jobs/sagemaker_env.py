"""The SageMaker script-mode contract: each host's ``/opt/ml``-style tree and the ``SM_*`` variables.

Everything here reproduces what the SageMaker training toolkit (``sagemaker-training-toolkit``: ``_env.py``,
``_mapping.py``, ``_params.py``) gives a script, so a script written for SageMaker runs unchanged:

- ``input/config/hyperparameters.json`` holds every hyperparameter as a *JSON-encoded string* (``5`` -> ``"5"``,
  ``"adam"`` -> ``"\\"adam\\""``), plus the SDK's ``sagemaker_*`` entries; the toolkit decodes each value with
  ``json.loads`` (keeping the raw string when that fails).
- ``SM_*`` values: strings as they are, everything else ``json.dumps(v, sort_keys=True, separators=(",", ":"))``.
- ``SM_USER_ARGS`` / the script's argv: hyperparameters sorted by name, ``--name value`` (``-n value`` for a
  one-letter name); the value is ``str(value)``, so booleans become ``True``/``False``, lists Python's
  ``[1, 2]``, and a dict ``a=1,b=2`` (sorted by key); ``None`` becomes an empty string.
- ``SM_HP_<NAME>`` upper-cases the name and keeps its other characters (``learning-rate`` -> ``SM_HP_LEARNING-RATE``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora.jobs.cluster import LOOPBACK_INTERFACE, host_names
from hora.jobs.distribution import PS_HYPERPARAMETER
from hora.jobs.spec import JobSpec
from hora.jobs.store import write_private

__all__ = [
    "HostLayout",
    "decode_hyperparameters",
    "encode_hyperparameters",
    "env_value",
    "host_layout",
    "input_data_config",
    "resource_config",
    "sm_environment",
    "sm_variables",
    "to_cmd_args",
    "write_host_config",
]

LOG_LEVEL = 20  # logging.INFO: the toolkit's default sagemaker_container_log_level
#: The SDK's own hyperparameters: the toolkit hides them from SM_HPS and the script's arguments.
SAGEMAKER_HYPERPARAMETERS = (
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_enable_cloudwatch_metrics",
    "sagemaker_region",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
)
INSTANCE_GROUP = "homogeneousCluster"


@dataclass(frozen=True)
class HostLayout:
    """The directories and files of one host (its ``/opt/ml``)."""

    root: Path

    @property
    def input_dir(self) -> Path:
        return self.root / "input"

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def data_dir(self) -> Path:
        return self.root / "input" / "data"

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.root / "output" / "data"

    @property
    def intermediate_dir(self) -> Path:
        return self.root / "output" / "intermediate"

    @property
    def failure_file(self) -> Path:
        return self.root / "output" / "failure"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    def create(self) -> None:
        for d in (self.config_dir, self.data_dir, self.code_dir, self.model_dir, self.output_data_dir,
                  self.intermediate_dir, self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)


def host_layout(job_dir: str | os.PathLike[str], host: str) -> HostLayout:
    return HostLayout(Path(job_dir) / "hosts" / host)


def encode_hyperparameters(spec: JobSpec) -> dict[str, str]:
    """hyperparameters.json as the SageMaker SDK writes it: every value JSON-encoded into a string, with the
    SDK's ``sagemaker_*`` entries (program, submit directory, job name, log level, distribution: the MPI settings,
    or ``sagemaker_parameter_server_enabled``)."""
    hps: dict[str, Any] = dict(spec.hyperparameters)
    hps.update(
        sagemaker_program=spec.entry_point,
        sagemaker_submit_directory=spec.source_dir,
        sagemaker_container_log_level=LOG_LEVEL,
        sagemaker_job_name=spec.job_name,
        sagemaker_region="local",
    )
    if spec.strategy in ("mpi", "allreduce"):
        hps.update(
            sagemaker_mpi_enabled=True,
            sagemaker_mpi_num_of_processes_per_host=spec.processes_per_host,
            sagemaker_mpi_custom_mpi_options=spec.custom_mpi_options,
        )
    elif spec.strategy == "parameter_server":  # the SDK's Framework._distribution_configuration
        hps[PS_HYPERPARAMETER] = True
    return {k: json.dumps(v) for k, v in hps.items()}


def decode_hyperparameters(raw: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The toolkit's reading of hyperparameters.json: (user hyperparameters, sagemaker_* ones it consumes,
    additional framework parameters = the other ``sagemaker_*`` ones, e.g. the MPI settings)."""
    decoded: dict[str, Any] = {}
    for k, v in raw.items():
        try:
            decoded[k] = json.loads(v)
        except (TypeError, ValueError):
            decoded[k] = v
    sagemaker = {k: v for k, v in decoded.items() if k in SAGEMAKER_HYPERPARAMETERS}
    framework = {k: v for k, v in decoded.items() if k.startswith("sagemaker_") and k not in sagemaker}
    user = {k: v for k, v in decoded.items() if not k.startswith("sagemaker_")}
    return user, sagemaker, framework


def _decode(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("latin1")
    return str(value)


def to_cmd_args(hyperparameters: dict[str, Any]) -> list[str]:
    """The toolkit's ``_mapping.to_cmd_args``: sorted ``--name value`` pairs (see the module docstring)."""
    out: list[str] = []
    for key in sorted(hyperparameters):
        name = _decode(key)
        out.append(f"--{name}" if len(name) > 1 else f"-{name}" if name else "")
        value = hyperparameters[key]
        if hasattr(value, "items"):
            out.append(",".join(f"{k}={v}" for k, v in sorted(value.items())))
        else:
            out.append(_decode(value))
    return out


def env_value(value: Any) -> str:
    """The toolkit's ``_mapping.to_env_vars`` value encoding."""
    if isinstance(value, bytes):
        return value.decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def resource_config(spec: JobSpec, host: str, interface: str = LOOPBACK_INTERFACE) -> dict[str, Any]:
    hosts = host_names(spec.instance_count)
    return {
        "current_host": host,
        "current_instance_type": spec.instance_type,
        "current_group_name": INSTANCE_GROUP,
        "hosts": hosts,
        "instance_groups": [
            {"instance_group_name": INSTANCE_GROUP, "instance_type": spec.instance_type, "hosts": hosts}
        ],
        "network_interface_name": interface,
    }


def input_data_config(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ch in spec.inputs:
        entry = {
            "TrainingInputMode": ch.input_mode,
            "S3DistributionType": ch.distribution,
            "RecordWrapperType": ch.record_wrapping or "None",
        }
        if ch.content_type:
            entry["ContentType"] = ch.content_type
        out[ch.name] = entry
    return out


def write_host_config(spec: JobSpec, layout: HostLayout, host: str, interface: str = LOOPBACK_INTERFACE) -> None:
    """Write input/config/{hyperparameters,resourceconfig,inputdataconfig}.json for ``host`` (whose network
    interface is ``interface``)."""
    layout.create()
    files = {
        "hyperparameters.json": encode_hyperparameters(spec),
        "resourceconfig.json": resource_config(spec, host, interface),
        "inputdataconfig.json": input_data_config(spec),
    }
    for name, content in files.items():
        write_private(layout.config_dir / name, json.dumps(content, indent=2) + "\n")  # hyperparameters: 0600


def num_gpus() -> int:
    """As the toolkit counts them: the lines of ``nvidia-smi --list-gpus``, 0 when there is none."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.stdout.splitlines() if line.strip()])


def module_name(entry_point: str) -> str:
    return entry_point[:-3] if entry_point.endswith(".py") else entry_point


def sm_environment(spec: JobSpec, layout: HostLayout, host: str, cpus: int, gpus: int) -> dict[str, str]:
    """Every ``SM_*`` variable the toolkit sets for a script on ``host``, read back from the host's config files
    (so the files and the variables cannot disagree)."""
    raw = json.loads((layout.config_dir / "hyperparameters.json").read_text())
    resource = json.loads((layout.config_dir / "resourceconfig.json").read_text())
    data_config = json.loads((layout.config_dir / "inputdataconfig.json").read_text())
    return sm_variables(spec, layout, host, cpus, gpus, raw, resource, data_config)


def sm_variables(
    spec: JobSpec,
    layout: HostLayout,
    host: str,
    cpus: int,
    gpus: int,
    raw_hyperparameters: dict[str, str],
    resource: dict[str, Any],
    data_config: dict[str, Any],
) -> dict[str, str]:
    """The ``SM_*`` variables of :func:`sm_environment` from the config files' contents (hyperparameters.json as
    written, resourceconfig.json, inputdataconfig.json): what ``hora job manifest`` puts into a Kubernetes pod
    template, where the files are not written on this machine."""
    hps, _, framework = decode_hyperparameters(raw_hyperparameters)
    hosts = resource["hosts"]
    channels = {name: str(layout.data_dir / name) for name in data_config}
    training_env: dict[str, Any] = {
        "additional_framework_parameters": framework,
        "channel_input_dirs": channels,
        "current_host": host,
        "current_instance_group": INSTANCE_GROUP,
        "current_instance_group_hosts": hosts,
        "current_instance_type": spec.instance_type,
        "distribution_hosts": hosts if spec.strategy != "none" else [],
        "distribution_instance_groups": [INSTANCE_GROUP] if spec.strategy != "none" else [],
        "framework_module": None,
        "hosts": hosts,
        "hyperparameters": hps,
        "input_config_dir": str(layout.config_dir),
        "input_data_config": data_config,
        "input_dir": str(layout.input_dir),
        "instance_groups": [INSTANCE_GROUP],
        "instance_groups_dict": {
            INSTANCE_GROUP: {"hosts": hosts, "instance_group_name": INSTANCE_GROUP, "instance_type": spec.instance_type}
        },
        "is_hetero": False,
        "is_master": host == hosts[0],
        "is_modelparallel_enabled": None,
        "job_name": spec.job_name,
        "log_level": LOG_LEVEL,
        "master_hostname": hosts[0],
        "model_dir": str(layout.model_dir),
        "module_dir": spec.source_dir,
        "module_name": module_name(spec.entry_point),
        "network_interface_name": resource["network_interface_name"],
        "num_cpus": cpus,
        "num_gpus": gpus,
        "num_neurons": 0,
        "output_data_dir": str(layout.output_data_dir),
        "output_dir": str(layout.output_dir),
        "output_intermediate_dir": str(layout.intermediate_dir),
        "resource_config": resource,
        "user_entry_point": spec.entry_point,
    }
    env: dict[str, Any] = {  # the toolkit's names, spelled out so grep finds them
        "SM_HOSTS": hosts,
        "SM_NETWORK_INTERFACE_NAME": resource["network_interface_name"],
        "SM_HPS": hps,
        "SM_USER_ENTRY_POINT": spec.entry_point,
        "SM_FRAMEWORK_PARAMS": framework,
        "SM_RESOURCE_CONFIG": resource,
        "SM_INPUT_DATA_CONFIG": data_config,
        "SM_OUTPUT_DATA_DIR": str(layout.output_data_dir),
        "SM_CHANNELS": sorted(channels),
        "SM_CURRENT_HOST": host,
        "SM_CURRENT_INSTANCE_TYPE": spec.instance_type,
        "SM_CURRENT_INSTANCE_GROUP": INSTANCE_GROUP,
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": hosts,
        "SM_INSTANCE_GROUPS": [INSTANCE_GROUP],
        "SM_INSTANCE_GROUPS_DICT": training_env["instance_groups_dict"],
        "SM_DISTRIBUTION_INSTANCE_GROUPS": training_env["distribution_instance_groups"],
        "SM_IS_HETERO": False,
        "SM_MODULE_NAME": module_name(spec.entry_point),
        "SM_LOG_LEVEL": LOG_LEVEL,
        "SM_FRAMEWORK_MODULE": None,
        "SM_INPUT_DIR": str(layout.input_dir),
        "SM_INPUT_CONFIG_DIR": str(layout.config_dir),
        "SM_OUTPUT_DIR": str(layout.output_dir),
        "SM_NUM_CPUS": cpus,
        "SM_NUM_GPUS": gpus,
        "SM_NUM_NEURONS": 0,
        "SM_MODEL_DIR": str(layout.model_dir),
        "SM_MODULE_DIR": spec.source_dir,
        "SM_TRAINING_ENV": training_env,
        "SM_USER_ARGS": to_cmd_args(hps),
        "SM_OUTPUT_INTERMEDIATE_DIR": str(layout.intermediate_dir),
    }
    for name, path in channels.items():
        env[f"SM_CHANNEL_{name.upper()}"] = path
    for key, value in hps.items():
        env[f"SM_HP_{str(key).upper()}"] = value
    return {k: env_value(v) for k, v in env.items()}
