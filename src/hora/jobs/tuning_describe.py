"""A tuning job as SageMaker's API names it: DescribeHyperParameterTuningJob (:func:`describe_tuning_job`) and
ListTrainingJobsForHyperParameterTuningJob's summaries (:func:`training_job_summaries`). Times are timezone-aware
``datetime`` objects, as boto3 returns them (the SDK's analytics subtract them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hora.errors import ConfigError
from hora.jobs.tuning_store import TuningStore
from hora.jobs.warm_start import parent_trials

__all__ = ["best_trial", "describe_tuning_job", "training_job_summaries"]


def _time(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(t, tz=dt.timezone.utc)


def _live(tstore: TuningStore, trial: dict[str, Any]) -> dict[str, Any]:
    """The trial as recorded by the tuning job, with its start time from the job store while it runs."""
    if trial["status"] != "InProgress":
        return trial
    try:
        record = tstore.jobs.get(trial["name"])
    except ConfigError:  # removed with `hora job rm`
        return trial
    return {**trial, "started": record.started}


def _summary(trial: dict[str, Any], metric: str, objective_type: str) -> dict[str, Any]:
    status = trial["status"]
    out: dict[str, Any] = {
        "TrainingJobName": trial["name"],
        "TrainingJobStatus": status,
        "TunedHyperParameters": {k: str(v) for k, v in trial["tuned"].items()},
        "CreationTime": _time(trial["created"]),
        "ObjectiveStatus": ("Pending" if status == "InProgress" else
                            "Succeeded" if trial["objective"] is not None else "Failed"),
    }
    if trial.get("started") is not None:
        out["TrainingStartTime"] = _time(trial["started"])
    if trial.get("ended") is not None and status != "InProgress":
        out["TrainingEndTime"] = _time(trial["ended"])
    if trial["objective"] is not None:
        out["FinalHyperParameterTuningJobObjectiveMetric"] = {
            "Type": objective_type, "MetricName": metric, "Value": trial["objective"]}
    if trial.get("failure_reason"):
        out["FailureReason"] = trial["failure_reason"]
    return out


def training_job_summaries(tstore: TuningStore, name: str) -> list[dict[str, Any]]:
    """Every trial of the tuning job, in the order they were started."""
    config, state = tstore.config(name), tstore.state(name)
    objective = config["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]
    return [_summary(_live(tstore, t), objective["MetricName"], objective["Type"]) for t in state["trials"]]


def best_trial(trials: list[dict[str, Any]], maximize: bool) -> dict[str, Any] | None:
    """The ended trial with the best final objective (a failed trial has none, so it never counts); the earliest
    wins a tie."""
    scored = [t for t in trials if t["status"] in ("Completed", "Stopped") and t["objective"] is not None]
    if not scored:
        return None
    return (max if maximize else min)(scored, key=lambda t: t["objective"])


def describe_tuning_job(tstore: TuningStore, name: str) -> dict[str, Any]:
    config, state = tstore.config(name), tstore.state(name)
    cfg = config["HyperParameterTuningJobConfig"]
    objective = cfg["HyperParameterTuningJobObjective"]
    trials = state["trials"]
    count = {s: sum(t["status"] == s for t in trials) for s in ("Completed", "InProgress", "Stopped", "Failed")}
    out: dict[str, Any] = {
        "HyperParameterTuningJobName": name,
        "HyperParameterTuningJobConfig": cfg,
        "TrainingJobDefinition": config["TrainingJobDefinition"],
        "HyperParameterTuningJobStatus": state["status"],
        "CreationTime": _time(config["created"]),
        "LastModifiedTime": _time(state.get("modified", config["created"])),
        "TrainingJobStatusCounters": {
            "Completed": count["Completed"], "InProgress": count["InProgress"], "RetryableError": 0,
            "NonRetryableError": count["Failed"], "Stopped": count["Stopped"]},
        "ObjectiveStatusCounters": {
            "Succeeded": sum(t["objective"] is not None for t in trials),
            "Pending": count["InProgress"],
            "Failed": sum(t["objective"] is None and t["status"] != "InProgress" for t in trials)},
    }
    if state.get("ended") is not None:
        out["HyperParameterTuningEndTime"] = _time(state["ended"])
    best = best_trial(trials, objective["Type"] == "Maximize")
    if best is not None:
        out["BestTrainingJob"] = _summary(best, objective["MetricName"], objective["Type"])
    if state.get("failure_reason") and state["status"] in ("Failed", "Stopped"):
        out["FailureReason"] = state["failure_reason"]
    if "WarmStartConfig" in config:
        out["WarmStartConfig"] = config["WarmStartConfig"]
        parents = [p["HyperParameterTuningJobName"]
                   for p in config["WarmStartConfig"]["ParentHyperParameterTuningJobs"]]
        overall = best_trial([{**t, "tuning_job": name} for t in trials] + parent_trials(tstore, parents),
                             objective["Type"] == "Maximize")
        if overall is not None:
            out["OverallBestTrainingJob"] = {**_summary(overall, objective["MetricName"], objective["Type"]),
                                             "TuningJobName": overall["tuning_job"]}
    if "TuningJobCompletionCriteria" in cfg:
        details: dict[str, Any] = {"NumberOfTrainingJobsObjectiveNotImproving": state.get("not_improving", 0)}
        if state.get("convergence_detected") is not None:
            details["ConvergenceDetectedTime"] = _time(state["convergence_detected"])
        out["TuningJobCompletionDetails"] = details
    return out
