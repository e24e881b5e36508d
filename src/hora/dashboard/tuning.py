"""What the dashboard shows of tuning jobs, as JSON-ready values read through the tuning store and its views
(:mod:`hora.jobs.tuning_store`, :func:`hora.jobs.tuning_views.tuning_overview`).

Chosen field by field: a tuning job's ranges, limits, objective, static hyperparameters and metric definitions, and
its trials as its state records them; never its trial template or the estimator's fields (a job spec, whose
``environment`` values may be credentials). Nothing here writes, except that a tuning job whose supervisor died is
marked Failed when it is looked at, as ``hora job tune list`` does.
"""

from __future__ import annotations

from typing import Any

from hora.dashboard.data import plain
from hora.errors import ConfigError
from hora.jobs.store import JobStore
from hora.jobs.tuning_store import TERMINAL, TuningStore
from hora.jobs.tuning_views import tuning_overview

__all__ = ["tuning_detail", "tuning_jobs", "tuning_summary"]


def tuning_summary(tstore: TuningStore, name: str, overview: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row of the dashboard's list of tuning jobs."""
    o = overview or tuning_overview(tstore, name)
    config, state, best = o["config"], o["state"], o["best"]
    cfg = config["HyperParameterTuningJobConfig"]
    objective = cfg["HyperParameterTuningJobObjective"]
    return {
        "name": name,
        "status": state["status"],
        "strategy": cfg["Strategy"],
        "objective": {"name": objective["MetricName"], "type": objective["Type"]},
        "trials_done": o["done"],
        "trials_started": len(state["trials"]),
        "max_jobs": o["max_jobs"],
        "best": None if best is None else {
            "name": best["name"], "objective": best["objective"], "tuned": plain(best["tuned"])},
        "created": config["created"],
        "ended": state.get("ended"),
        "done": state["status"] in TERMINAL,
    }


def tuning_jobs(store: JobStore) -> list[dict[str, Any]]:
    """Every tuning job, newest first (one being created, whose state is not written yet, shows once it is)."""
    tstore = TuningStore(store)
    rows = []
    for name in tstore.names():
        try:
            rows.append(tuning_summary(tstore, name))
        except ConfigError:  # its config.json is there, its state.json not yet
            continue
    return sorted(rows, key=lambda t: t["created"], reverse=True)


def _ranges(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The tuned hyperparameters' ranges, in the order they were given within each kind."""
    out = []
    for group, ranges in cfg["ParameterRanges"].items():
        kind = group.removesuffix("ParameterRanges")
        for r in ranges:
            if "Values" in r:
                out.append({"name": r["Name"], "type": kind, "values": plain(r["Values"])})
            else:
                out.append({"name": r["Name"], "type": kind, "min": r["MinValue"], "max": r["MaxValue"],
                            "scaling": r.get("ScalingType", "Auto")})
    return out


def _trial(index: int, t: dict[str, Any]) -> dict[str, Any]:
    started, ended = t.get("started"), t.get("ended")
    return {
        "index": index,
        "name": t["name"],
        "tuned": plain(t["tuned"]),
        "status": t["status"],
        "objective": t["objective"],
        "created": t["created"],
        "started": started,
        "ended": ended if t["status"] != "InProgress" else None,
        "elapsed": ended - started if started is not None and ended is not None and t["status"] != "InProgress"
        else None,
        "epochs": len(t.get("series") or []),
        "reason": t.get("failure_reason") or None,
    }


def tuning_detail(store: JobStore, name: str) -> dict[str, Any]:
    """A tuning job's page: its summary, what it was asked to do, where it stands, its trials in the order they were
    started, and ``series``: each trial's objective values by epoch, by trial name (as the tuning job's supervisor
    last read them from the trial's metrics: the first rank's values, in the order it printed them)."""
    tstore = TuningStore(store)
    o = tuning_overview(tstore, name)
    config, state = o["config"], o["state"]
    cfg = config["HyperParameterTuningJobConfig"]
    limits = cfg["ResourceLimits"]
    definition = config["TrainingJobDefinition"]
    return {
        **tuning_summary(tstore, name, o),
        "limits": {"max_jobs": limits["MaxNumberOfTrainingJobs"],
                   "max_parallel_jobs": limits["MaxParallelTrainingJobs"],
                   "max_runtime_in_seconds": limits.get("MaxRuntimeInSeconds")},
        "early_stopping": cfg.get("TrainingJobEarlyStoppingType", "Off"),
        "random_seed": cfg.get("RandomSeed"),
        "ranges": _ranges(cfg),
        "static_hyperparameters": plain(definition.get("StaticHyperParameters") or {}),
        "metric_definitions": [
            {"name": m.get("Name"), "regex": m.get("Regex")}
            for m in (definition.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []],
        "failure_reason": state.get("failure_reason"),
        "stop_requested": bool(state.get("stop_requested")),
        "trials": [_trial(i, t) for i, t in enumerate(state["trials"], start=1)],
        "series": {t["name"]: list(t.get("series") or []) for t in state["trials"]},
    }

