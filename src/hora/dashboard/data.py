"""What the dashboard shows of a job, as JSON-ready values read from the job store and the job's files.

Nothing here writes, except :func:`hora.jobs.api.reconcile` marking a job whose supervisor died (as ``hora job
list`` does). What leaves this module is chosen field by field: a spec's ``environment`` shows its variables' names
only (values may be credentials), and no file outside the job's recorded artifacts, timeline and autotune log is
ever offered for download.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hora.jobs.api import reconcile
from hora.jobs.store import JobRecord, JobStore
from hora.jobs.tuning_store import TuningStore

__all__ = ["downloads", "job_detail", "job_summary", "jobs", "metric_rows", "plain", "system_rows"]

#: Spec fields shown as they are on a job's page (the rest are the job's own plumbing or shown elsewhere).
SHOWN_SPEC = (
    "entry_point", "source_dir", "instance_count", "processes_per_host", "distribution", "input_mode",
    "output_path", "checkpoint_s3_uri", "max_run", "max_retry_attempts", "use_spot_instances", "max_wait",
    "metric_definitions", "custom_mpi_options", "base_job_name",
)
#: The variables (and the hora run setting) that name a job's timeline and autotune log, Horovod's and hora's.
TIMELINE = ("HOROVOD_TIMELINE", "HORA_TIMELINE", "timeline")
AUTOTUNE_LOG = ("HOROVOD_AUTOTUNE_LOG", "HORA_AUTOTUNE_LOG", "autotune_log_file")


def job_summary(r: JobRecord, tuning_job: str | None = None) -> dict[str, Any]:
    """One row of the job list (``tuning_job``: the tuning job the job is a trial of)."""
    spec = r.spec
    return {
        "name": r.name,
        "kind": spec.get("kind", "job"),
        "status": str(r.status),
        "secondary_status": str(r.secondary_status),
        "hosts": int(spec.get("instance_count", 1)),
        "processes_per_host": int(spec.get("processes_per_host", 1)),
        "created": r.created,
        "started": r.started,
        "ended": r.ended,
        "duration": r.duration,
        "done": r.done,
        "entry_point": spec.get("entry_point"),
        "hyperparameters": plain(spec.get("hyperparameters") or {}),
        "attempts": r.attempts,
        "tuning_job": tuning_job,
    }


def jobs(store: JobStore) -> list[dict[str, Any]]:
    """Every job, newest first."""
    records = [reconcile(store, r) if not r.done else r for r in store.jobs()]
    trials = TuningStore(store).trial_index()
    return [job_summary(r, trials.get(r.name)) for r in sorted(records, key=lambda r: r.created, reverse=True)]


def job_detail(store: JobStore, name: str) -> dict[str, Any]:
    """A job's page: its summary, spec, status history, failure reason, hosts and downloads (looked up every time a
    page's stream polls: nothing here scans the job's metric values)."""
    r = reconcile(store, store.get(name))
    spec = {k: plain(r.spec[k]) for k in SHOWN_SPEC if r.spec.get(k) not in (None, "", [], {})}
    environment = r.spec.get("environment") or {}
    return {
        **job_summary(r, TuningStore(store).trial_index().get(name)),
        "spec": spec,
        "environment_names": sorted(environment) if isinstance(environment, dict) else [],
        "failure_reason": r.failure_reason,
        "exit_code": r.exit_code,
        "stop_requested": r.stop_requested,
        "transitions": [
            {"time": t, "status": s, "secondary_status": s2, "message": m or ""}
            for t, s, s2, m in store.transitions(name)
        ],
        "host_names": r.host_names,
        "downloads": [{k: v for k, v in d.items() if k != "path"} for d in downloads(r).values()],
    }


def metric_rows(store: JobStore, name: str, after: int = 0, limit: int = 50_000) -> tuple[list[list[Any]], int]:
    """The job's metric values stored after row ``after``: ``[name, value, time, host, rank, attempt]`` each, and
    the row to ask after next time."""
    rows = store.metrics_after(name, after, limit)
    return [list(row[1:]) for row in rows], (rows[-1][0] if rows else after)


def system_rows(store: JobStore, name: str, since: float = 0.0) -> tuple[list[list[Any]], float]:
    """The hosts' system metrics sampled after ``since``: ``[host, time, name, value]`` each, and the time to ask
    after next time (none when the job's profiler_config turned sampling off)."""
    samples = [sample for sample in store.iter_system_metrics(name, since) if sample[1] > since]
    return [list(sample) for sample in samples], max((sample[1] for sample in samples), default=since)


def downloads(r: JobRecord) -> dict[str, dict[str, Any]]:
    """What a job's page offers for download, by key: the recorded artifacts that are local files, and the
    timeline and autotune log of the master host when the job wrote them. ``path`` stays on the server."""
    found: dict[str, tuple[str, Path]] = {}
    for kind, where in sorted(r.artifacts.items()):
        if not str(where).startswith("s3://"):
            found[kind] = (f"{kind} ({Path(where).name})", Path(where))
    for key, names in (("timeline", TIMELINE), ("autotune", AUTOTUNE_LOG)):
        path = _written_file(r, names)
        if path is not None:
            found[key] = (f"{key} ({path.name})", path)
    out: dict[str, dict[str, Any]] = {}
    for key, (label, path) in found.items():
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size is not None:
            out[key] = {"key": key, "label": label, "size": size, "path": path}
    return out


def _written_file(r: JobRecord, names: tuple[str, str, str]) -> Path | None:
    """The file a job's ``-x`` variables or hora run settings name (``-x HOROVOD_TIMELINE=...``,
    ``--timeline-filename``), on the master host's tree; None when the job names none or has not written it."""
    exports = r.spec.get("mpi_exports") or {}
    settings = r.spec.get("run_settings") or {}
    value = exports.get(names[0]) or exports.get(names[1]) or settings.get(names[2])
    if not value or not isinstance(value, str):
        return None
    tree = Path(r.job_dir) / "hosts" / "algo-1"  # the host's /opt/ml (mounted there or rewritten to it)
    path = Path(value)
    if value == "/opt/ml" or value.startswith("/opt/ml/"):
        path = tree / os.path.relpath(value, "/opt/ml")
    elif not path.is_absolute():
        path = tree / "code" / path  # the script's working directory
    return path if path.is_file() else None


def plain(value: Any) -> Any:
    """A spec value as JSON can carry it."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
