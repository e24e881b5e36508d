"""The job spec: what a training job runs, on how many hosts, with which data, and its limits.

A spec comes from a YAML file (:func:`load_spec`) or from Python (:class:`hora.jobs.Estimator`); either way
:func:`parse_spec` checks *everything* before anything starts and raises one :class:`SpecError` that lists every
problem, so a user fixes a spec in one round instead of one error at a time.

Field names follow the SageMaker Python SDK (``entry_point``, ``instance_count``, ``max_run`` ...), so a spec reads
like the ``Estimator(...)`` call it replaces.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hora.config import parse_value
from hora.config.variables import read
from hora.errors import ConfigError, SpecError
from hora.jobs import export_spec, remote_spec
from hora.jobs.checks import Checker as _Checker
from hora.jobs.checks import type_name as _type_name
from hora.jobs.checks import unknown_field as _unknown
from hora.jobs.distribution import parse_distribution
from hora.jobs.profiler import DEFAULT_INTERVAL_MILLIS, parse_profiler_config
from hora.runner.limits import process_count_problem

__all__ = ["ChannelSpec", "JobSpec", "MetricDefinition", "SpecError", "load_spec", "parse_spec", "spec_from_dict"]

INPUT_MODES = ("File", "Pipe")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
DEFAULT_MAX_RUN = 24 * 3600  # SageMaker's default MaxRuntimeInSeconds
DEFAULT_STOP_GRACE = 30.0
DEFAULT_MASTER_TIMEOUT = 120.0
NETWORKS = ("auto", "namespace", "loopback")
_JOB_NAME = re.compile(r"^[A-Za-z0-9](-*[A-Za-z0-9]){0,62}$")  # SageMaker's TrainingJobName pattern
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9\.\-_]{1,64}$")  # SageMaker's ChannelName pattern

FIELDS = (
    "entry_point", "source_dir", "hyperparameters", "instance_count", "instance_type", "processes_per_host",
    "distribution", "inputs", "input_mode", "output_path", "checkpoint_path", "metric_definitions", "max_run",
    "max_retry_attempts", "environment", "job_name", "stop_grace", "network", "master_timeout",
    "use_spot_instances", "max_wait", "spot_interruptions", "profiler_config", "cluster", *export_spec.EXPORT_FIELDS,
)
CHANNEL_FIELDS = ("uri", "s3_data", "input_mode", "distribution", "content_type", "record_wrapping")


#: The most bytes hyperparameters (as JSON) or one environment value may take: Linux's MAX_ARG_STRLEN (128 KiB)
#: bounds one argument or variable, and SM_HPS carries every hyperparameter; the rest is headroom for the
#: SDK's own entries.
MAX_HYPERPARAMETER_BYTES = 100_000


@dataclass(frozen=True)
class ChannelSpec:
    """One input channel: where its data comes from and how the script sees it.

    ``uri`` is a local path (made absolute) or an ``s3://`` URI. ``input_mode`` is ``File`` (copied into
    ``input/data/<name>`` before the script starts) or ``Pipe`` (FIFOs ``<name>_<epoch>``), ``distribution``
    ``FullyReplicated`` (every host gets everything) or ``ShardedByS3Key`` (each host its share of the keys).
    """

    name: str
    uri: str
    input_mode: str = "File"
    distribution: str = "FullyReplicated"
    content_type: str | None = None
    record_wrapping: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")


@dataclass(frozen=True)
class MetricDefinition:
    """A metric: every log line the regex matches gives one value (its first group, else the whole match)."""

    name: str
    regex: str


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec (build it with :func:`parse_spec`; every path in it is absolute)."""

    entry_point: str  # relative to source_dir
    source_dir: str
    job_name: str
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    instance_count: int = 1
    instance_type: str = "local"
    processes_per_host: int = 1
    strategy: str = "none"  # none | mpi | allreduce | parameter_server
    ps_servers: str = "tensorflow"  # parameter_server: whose servers run beside the workers (PS_SERVERS)
    custom_mpi_options: str = ""
    run_settings: dict[str, Any] = field(default_factory=dict)  # hora run settings from custom_mpi_options
    mpi_exports: dict[str, str] = field(default_factory=dict)  # custom_mpi_options' -x NAME=VALUE, for every rank
    inputs: tuple[ChannelSpec, ...] = ()
    output_path: str | None = None
    checkpoint_path: str | None = None
    metric_definitions: tuple[MetricDefinition, ...] = ()
    max_run: float = DEFAULT_MAX_RUN
    max_retry_attempts: int = 0
    environment: dict[str, str] = field(default_factory=dict)
    stop_grace: float = DEFAULT_STOP_GRACE
    network: str = "auto"  # auto | namespace | loopback: how the hosts get their addresses (cluster.py)
    master_timeout: float = DEFAULT_MASTER_TIMEOUT  # how long the other hosts wait for algo-1 to start the ranks
    use_spot_instances: bool = False  # managed spot: reclaims restart the job from its checkpoints (spot.py)
    max_wait: float | None = None  # seconds the whole spot job may take, waits for capacity included
    spot_interruptions: tuple[float, ...] = ()  # seconds after the start at which to simulate a reclaim
    system_monitor_interval_millis: int | None = DEFAULT_INTERVAL_MILLIS  # profiler_config's; None: disabled
    tensorboard_output_config: export_spec.TensorBoardOutputConfig | None = None  # exporter.py acts on these
    mlflow: export_spec.MlflowConfig | None = None
    cluster: remote_spec.ClusterSpec | None = None  # real hosts over SSH (remote_hosts.py); None: this machine

    @property
    def host_count(self) -> int:
        return self.instance_count

    @property
    def world_size(self) -> int:
        return self.instance_count * self.processes_per_host

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (the job store keeps it; ``describe`` shows it)."""
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if k not in ("inputs", "metric_definitions", "cluster", *export_spec.EXPORT_FIELDS)
        }
        out["cluster"] = self.cluster.to_dict() if self.cluster else None
        out.update(export_spec.export_to_dict(self.tensorboard_output_config, self.mlflow))
        out["inputs"] = {c.name: c.__dict__ for c in self.inputs}
        out["metric_definitions"] = [{"Name": m.name, "Regex": m.regex} for m in self.metric_definitions]
        return out


def load_spec(path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """Read a YAML spec file; relative paths in it are relative to the file's directory."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            "reading a YAML job spec needs PyYAML: pip install -c constraints.txt -e '.[jobs]' in hora's checkout"
        ) from None
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the job spec {str(p)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([f"not valid YAML: {exc}"], f"job spec {str(p)!r}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(
            [f"the top level must be a mapping of fields, got {type(data).__name__}"], f"job spec {str(p)!r}"
        )
    data = {**data, **(overrides or {})}
    return parse_spec(data, base_dir=p.resolve().parent, source=f"job spec {str(p)!r}", confine=True)


def _local(path: str, base: Path) -> str:
    """``path`` made absolute against ``base``, symlinks resolved; a symlink loop stays unresolved (the callers'
    existence checks then name it)."""
    joined = base / os.path.expanduser(path)
    try:
        return str(joined.resolve())
    except RuntimeError:  # "Symlink loop from ..." (Python < 3.13)
        return str(joined)


def _outside(what: str, path: str, base: Path) -> str | None:
    """Why the relative code path ``path`` (the field ``what``) of a spec file is refused: it leaves the spec's
    directory tree (an absolute or ``~`` path is the user's deliberate choice)."""
    if os.path.isabs(os.path.expanduser(path)):
        return None
    where = Path(_local(path, base))
    if where.is_relative_to(base):
        return None
    return (
        f"{what} {path!r} resolves to {where}, outside the spec's directory {base}: its directory would be copied to "
        f"every host. Move the code under {base}, or give the path absolute if you mean it"
    )


def parse_spec(
    data: Mapping[str, Any],
    base_dir: str | os.PathLike[str] | None = None,
    source: str = "the job spec",
    confine: bool = False,
) -> JobSpec:
    """Check a spec given as a mapping and return the :class:`JobSpec`. With ``confine`` (a spec file), a relative
    ``entry_point`` or ``source_dir`` must stay inside ``base_dir``'s tree: the code directory is copied to every
    host, and ``../../etc/passwd`` would copy ``/etc``; an absolute path says the user means it.

    Raises:
        SpecError: listing every problem found (unknown fields with a did-you-mean, wrong types, a missing entry
            point or channel path, negative counts, unsupported strategies).
    """
    base = Path(base_dir or os.getcwd()).resolve()
    c = _Checker()
    for key in data:
        if key not in FIELDS:
            c.add(_unknown(str(key), FIELDS, ""))

    # Code: entry point (required) inside source_dir (default: the entry point's directory).
    entry = c.str_(data, "entry_point")
    source_dir = c.str_(data, "source_dir")
    entry_rel = ""
    src = ""
    if entry is None and "entry_point" not in data:
        c.add("entry_point is missing: name the training script, e.g. entry_point: train.py")
    elif entry is not None:
        named = ("source_dir", source_dir) if source_dir is not None else ("entry_point", entry)
        outside = _outside(*named, base) if confine else None
        if outside:
            c.add(outside)
        elif source_dir is not None:
            src = _local(source_dir, base)
            if not os.path.isdir(src):
                c.add(f"source_dir {source_dir!r} is not a directory (looked at {src})")
            elif not Path(src, entry).resolve().is_relative_to(src):
                c.add(f"entry_point {entry!r} leaves source_dir {src}: it must name a file inside it")
            elif not os.path.isfile(os.path.join(src, entry)):
                c.add(f"entry_point {entry!r} is not a file in source_dir {src}")
            entry_rel = entry
        else:
            full = _local(entry, base)
            if not os.path.isfile(full):
                c.add(f"entry_point {entry!r} does not exist (looked at {full})")
            src, entry_rel = os.path.dirname(full), os.path.basename(full)

    hps = data.get("hyperparameters") or {}
    if not isinstance(hps, Mapping):
        c.add(f"hyperparameters must be a mapping of name: value, got {_type_name(hps)}")
        hps = {}
    for k, v in hps.items():
        if not isinstance(k, str) or not k:
            c.add(f"hyperparameter name {k!r} must be a non-empty string")
        elif "=" in k or "\0" in k:
            c.add(f"hyperparameter name {k!r} cannot be passed to a process: it becomes the variable SM_HP_<NAME>, "
                  "whose name cannot hold '=' or a NUL byte")
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            c.add(f"hyperparameter {k!r} has a value that is not JSON-encodable: {v!r}")
        else:
            if "\\u0000" in json.dumps(v):  # JSON always escapes a NUL byte so
                c.add(f"hyperparameter {k!r} holds a NUL byte, which no command-line argument or variable can carry")
    if isinstance(hps, Mapping):
        size = len(json.dumps(dict(hps), default=str).encode())
        if size > MAX_HYPERPARAMETER_BYTES:
            c.add(f"hyperparameters take {size} bytes as JSON, above {MAX_HYPERPARAMETER_BYTES}: the script gets them "
                  "all in one variable (SM_HPS), and Linux passes at most 128 KiB in one; put large values in a file "
                  "of an input channel and pass its name")

    instance_count = c.int_(data, "instance_count", 1, 1)
    if instance_count > 254:
        c.add(f"instance_count {instance_count} is more than the 254 hosts a local cluster can address")
    instance_type = c.str_(data, "instance_type") or "local"
    pph = c.int_(data, "processes_per_host", 0, 1) if data.get("processes_per_host") is not None else 0

    dist = parse_distribution(data.get("distribution"), pph, hps, c)
    strategy, pph, hps = dist.strategy, dist.processes_per_host, dist.hyperparameters
    pph = pph or 1

    # Channels.
    job_mode = c.str_(data, "input_mode") or "File"
    if job_mode not in INPUT_MODES:
        c.add(f"input_mode {job_mode!r} must be File or Pipe")
        job_mode = "File"
    channels: list[ChannelSpec] = []
    inputs = data.get("inputs") or {}
    if isinstance(inputs, (str, os.PathLike)):
        inputs = {"training": inputs}  # SageMaker's fit("s3://...") means the "training" channel
    if not isinstance(inputs, Mapping):
        c.add(f"inputs must map channel names to a path, an s3:// URI or a mapping, got {_type_name(inputs)}")
        inputs = {}
    for name, value in inputs.items():
        ch = _channel(str(name), value, job_mode, base, c)
        if ch is not None:
            channels.append(ch)

    output_path = c.str_(data, "output_path")
    if output_path and not output_path.startswith("s3://"):
        output_path = _local(output_path, base)
    checkpoint_path = c.str_(data, "checkpoint_path")
    if checkpoint_path and not checkpoint_path.startswith("s3://"):
        checkpoint_path = _local(checkpoint_path, base)

    metrics: list[MetricDefinition] = []
    mdefs = data.get("metric_definitions") or []
    if not isinstance(mdefs, list):
        c.add(f"metric_definitions must be a list of {{Name, Regex}}, got {_type_name(mdefs)}")
        mdefs = []
    for i, m in enumerate(mdefs):
        if not isinstance(m, Mapping):
            c.add(f"metric_definitions[{i}] must be a mapping with Name and Regex, got {m!r}")
            continue
        norm = {str(k).lower(): v for k, v in m.items()}
        for k in norm:
            if k not in ("name", "regex"):
                c.add(_unknown(str(k), ("Name", "Regex"), f" in metric_definitions[{i}]"))
        name, regex = norm.get("name"), norm.get("regex")
        if not isinstance(name, str) or not name:
            c.add(f"metric_definitions[{i}] needs a Name (a string)")
            continue
        if not isinstance(regex, str) or not regex:
            c.add(f"metric {name!r} needs a Regex (a string)")
            continue
        try:
            re.compile(regex)
        except re.error as exc:
            c.add(f"metric {name!r}: Regex {regex!r} does not compile: {exc}")
            continue
        metrics.append(MetricDefinition(name, regex))

    max_run = c.number(data, "max_run", DEFAULT_MAX_RUN)
    retries = c.int_(data, "max_retry_attempts", 0, 0)
    stop_grace = c.number(data, "stop_grace", DEFAULT_STOP_GRACE)
    master_timeout = c.number(data, "master_timeout", DEFAULT_MASTER_TIMEOUT)
    network = data.get("network") or "auto"
    if network not in NETWORKS:
        c.add(f"network must be one of {', '.join(NETWORKS)}, got {network!r}")
    elif network == "namespace":
        from hora.jobs import netns

        why = netns.unavailable()
        if why:
            c.add(f"network: namespace cannot be used here: {why} (use network: loopback or auto)")

    env_in = data.get("environment") or {}
    environment: dict[str, str] = {}
    if not isinstance(env_in, Mapping):
        c.add(f"environment must be a mapping of NAME: value, got {_type_name(env_in)}")
    else:
        for k, v in env_in.items():
            if not isinstance(k, str) or not k or "=" in k or "\0" in k:
                c.add(f"environment variable name {k!r} is not valid")
            elif isinstance(v, (dict, list)) or v is None:
                c.add(f"environment variable {k} must be a string or number, got {v!r}")
            elif "\0" in str(v) or len(str(v).encode()) > MAX_HYPERPARAMETER_BYTES:
                c.add(f"environment variable {k} cannot be passed to a process: a NUL byte, or above "
                      f"{MAX_HYPERPARAMETER_BYTES} bytes (Linux passes at most 128 KiB in one variable)")
            else:
                environment[k] = str(v).lower() if isinstance(v, bool) else str(v)

    per_host = pph + (1 if strategy == "parameter_server" else 0)  # a parameter server beside each host's ranks
    problem = process_count_problem(
        instance_count * per_host, "the job", _oversubscribe(dist.run_settings, environment)
    )
    cluster = remote_spec.parse_cluster(data.get("cluster"), base, instance_count, c.add)
    if problem and cluster is None:  # every host of the job is a process tree on this machine
        c.add(f"instance_count {instance_count} x processes_per_host {pph}: {problem}")

    use_spot, max_wait, interruptions = _spot(data, max_run, c)
    monitor_millis = parse_profiler_config(data.get("profiler_config"), c)  # None: the system monitoring is off
    exports = export_spec.parse_exports(data, base, c)

    job_name = c.str_(data, "job_name")
    if job_name is not None and not _JOB_NAME.match(job_name):
        c.add(f"job_name {job_name!r} must be 1-63 letters, digits and hyphens, starting with a letter or digit")
    if c.problems:
        raise SpecError(c.problems, source)
    if job_name is None:
        stem = re.sub(r"[^A-Za-z0-9]+", "-", Path(entry_rel).stem).strip("-")[:30] or "job"
        job_name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    return JobSpec(
        entry_point=entry_rel,
        source_dir=src,
        job_name=job_name,
        hyperparameters=dict(hps),
        instance_count=instance_count,
        instance_type=instance_type,
        processes_per_host=pph,
        strategy=strategy,
        ps_servers=dist.ps_servers,
        custom_mpi_options=dist.custom_mpi_options,
        run_settings=dist.run_settings,
        mpi_exports=dist.mpi_exports,
        inputs=tuple(channels),
        output_path=output_path,
        checkpoint_path=checkpoint_path,
        metric_definitions=tuple(metrics),
        max_run=max_run,
        max_retry_attempts=retries,
        environment=environment,
        stop_grace=stop_grace,
        network=network,
        master_timeout=master_timeout,
        use_spot_instances=use_spot,
        max_wait=max_wait,
        spot_interruptions=interruptions,
        system_monitor_interval_millis=monitor_millis, cluster=cluster,
        **exports,
    )


def _oversubscribe(run_settings: Mapping[str, Any], environment: Mapping[str, str]) -> bool:
    """Whether the spec (``custom_mpi_options: --oversubscribe``, its ``environment``) or the supervisor's
    environment allows more processes than the bound (``HORA_OVERSUBSCRIBE``)."""
    if "oversubscribe" in run_settings:
        return bool(run_settings["oversubscribe"])
    for env in (environment, None):
        raw = read("HORA_OVERSUBSCRIBE", env)
        if raw:
            try:
                return bool(parse_value("oversubscribe", raw))
            except ConfigError:
                return False
    return False


def _spot(data: Mapping[str, Any], max_run: float, c: _Checker) -> tuple[bool, float | None, tuple[float, ...]]:
    """``use_spot_instances``, ``max_wait`` and the simulated reclaims, with CreateTrainingJob's rules."""
    use_spot = data.get("use_spot_instances", False)
    if not isinstance(use_spot, bool):
        c.add(f"use_spot_instances must be true or false, got {use_spot!r}")
        use_spot = False
    max_wait = c.number(data, "max_wait", 0.0) if data.get("max_wait") is not None else None
    if use_spot and max_wait is None:
        c.add("use_spot_instances needs max_wait: the seconds the whole job may take, waiting for spot capacity "
              "included (SageMaker's MaxWaitTimeInSeconds), at least max_run")
    elif max_wait is not None and not use_spot:
        c.add("max_wait is only for managed spot training: set use_spot_instances: true, or leave max_wait out")
    elif max_wait is not None and max_wait < max_run:
        c.add(f"Invalid MaxWaitTimeInSeconds: max_wait ({max_wait:g}) must be greater than or equal to max_run "
              f"({max_run:g})")
    raw = data.get("spot_interruptions") or []
    times: list[float] = []
    if not isinstance(raw, list) or not all(isinstance(t, (int, float)) and t >= 0 for t in raw):
        c.add(f"spot_interruptions must be a list of seconds after the job's start (numbers >= 0), got {raw!r}")
    else:
        times = sorted(float(t) for t in raw)
    if times and not use_spot:
        c.add("spot_interruptions simulate reclaims of spot instances: set use_spot_instances: true")
    return use_spot, max_wait, tuple(times)


def _channel(name: str, value: Any, job_mode: str, base: Path, c: _Checker) -> ChannelSpec | None:
    if not _CHANNEL_NAME.match(name):
        c.add(f"channel name {name!r} must be 1-64 letters, digits, '.', '-' or '_'")
        return None
    opts: Mapping[str, Any]
    if isinstance(value, (str, os.PathLike)):
        opts = {"uri": os.fspath(value)}
    elif isinstance(value, Mapping):
        opts = value
        for k in opts:
            if k not in CHANNEL_FIELDS:
                c.add(_unknown(str(k), CHANNEL_FIELDS, f" in channel {name!r}"))
    else:
        c.add(f"channel {name!r} must be a path, an s3:// URI or a mapping with uri, got {_type_name(value)}")
        return None
    uri = c.str_(opts, "uri", f" of channel {name!r}") or c.str_(opts, "s3_data", f" of channel {name!r}")
    if not uri:
        c.add(f"channel {name!r} has no uri (a local path or s3://bucket/prefix)")
        return None
    if not uri.startswith("s3://"):
        if "://" in uri:
            c.add(f"channel {name!r}: {uri!r} is neither a local path nor an s3:// URI")
            return None
        path = _local(uri, base)
        if not os.path.exists(path):
            kind = "is a symlink loop or a broken symlink" if os.path.islink(path) else "does not exist"
            c.add(f"channel {name!r}: the path {uri!r} {kind} (looked at {path})")
            return None
        uri = path
    mode = c.str_(opts, "input_mode", f" of channel {name!r}") or job_mode
    if mode not in INPUT_MODES:
        c.add(f"channel {name!r}: input_mode {mode!r} must be File or Pipe")
    dist = c.str_(opts, "distribution", f" of channel {name!r}") or "FullyReplicated"
    if dist not in DISTRIBUTIONS:
        c.add(f"channel {name!r}: distribution {dist!r} must be FullyReplicated or ShardedByS3Key")
    wrapping = c.str_(opts, "record_wrapping", f" of channel {name!r}")
    if wrapping not in (None, "None", "RecordIO"):
        c.add(f"channel {name!r}: record_wrapping {wrapping!r} must be None or RecordIO")
    return ChannelSpec(name, uri, mode, dist, c.str_(opts, "content_type", f" of channel {name!r}"), wrapping)


def spec_from_dict(data: Mapping[str, Any]) -> JobSpec:
    """Rebuild a :class:`JobSpec` from :meth:`JobSpec.to_dict` (the store's copy; already validated)."""
    fields = dict(data)
    fields["inputs"] = tuple(ChannelSpec(**c) for c in fields.get("inputs", {}).values())
    fields["spot_interruptions"] = tuple(fields.get("spot_interruptions", ()))
    fields.update(export_spec.export_from_dict(fields), cluster=remote_spec.cluster_from_dict(fields.get("cluster")))
    fields["metric_definitions"] = tuple(
        MetricDefinition(m["Name"], m["Regex"]) for m in fields.get("metric_definitions", [])
    )
    return JobSpec(**fields)
