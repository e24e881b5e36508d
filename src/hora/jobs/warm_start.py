"""Warm start (``WarmStartConfig``): a tuning job that reuses the trials of up to 5 ended parent tuning jobs.

- :func:`warm_start_problems`: the checks made when the tuner is created (type, at most 5 parents);
- :func:`parent_problems`: the checks made when it starts (the service's CreateHyperParameterTuningJob rules): the
  parents exist and have ended, have the same objective metric, the same number of static plus tuned
  hyperparameters, the same type for a hyperparameter tuned in both, at most 10 changes from tuned to static or of
  static values; ``IdenticalDataAndAlgorithm`` also needs the same training script and input data;
- :func:`parent_trials`: the parents' own trials with an objective (warm start is not recursive: a parent's
  parents are not read), each with the hyperparameters it ran with, for the strategy and for
  ``OverallBestTrainingJob``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hora.errors import ConfigError
from hora.jobs.parameter import CategoricalParameter, ParameterRange, ranges_from_dict
from hora.jobs.tuning_store import TERMINAL, TuningStore

__all__ = ["MAX_CHANGES", "MAX_PARENTS", "parent_problems", "parent_trials", "warm_start_problems"]

MAX_PARENTS = 5
#: At most this many changes from tuned to static hyperparameters plus changes of static values (the service's).
MAX_CHANGES = 10
#: What "the same algorithm and data" compares between a parent's trials and the child's.
_SAME = ("entry_point", "source_dir", "inputs")


def warm_start_problems(config: Any) -> list[str]:
    from hora.jobs.tuner_configs import WarmStartConfig

    if config is None:
        return []
    if not isinstance(config, WarmStartConfig):
        return [f"warm_start_config must be a WarmStartConfig, got {type(config).__name__}"]
    if len(config.parents) > MAX_PARENTS:
        return [f"warm_start_config has {len(config.parents)} parents; a tuning job is warm started from at most "
                f"{MAX_PARENTS}: keep the best {MAX_PARENTS}"]
    bad = sorted(repr(p) for p in config.parents if not isinstance(p, str))
    if bad:
        return [f"warm_start_config parents must be tuning job names, got {', '.join(bad)}"]
    return []


def _changes(parent_ranges: Mapping[str, ParameterRange], parent_static: Mapping[str, str],
             ranges: Mapping[str, ParameterRange], static: Mapping[str, str]) -> int:
    """Tuned in the parent and static in the child (a categorical range counts its values, another range 1), and
    static in both with another value (2 each): the service's count of changes."""
    count = 0
    for name, r in parent_ranges.items():
        if name in static:
            count += len(r.values) if isinstance(r, CategoricalParameter) else 1
    count += 2 * sum(1 for k, v in static.items() if k in parent_static and parent_static[k] != v)
    return count


def parent_problems(tstore: TuningStore, warm_type: str, parents: list[str], metric: str,
                    ranges: Mapping[str, ParameterRange], static: Mapping[str, Any],
                    template: Mapping[str, Any]) -> list[str]:
    """Every reason the child (its objective ``metric``, ``ranges``, ``static`` hyperparameters and trial
    ``template``) cannot be warm started from ``parents``."""
    problems = []
    static_s = {k: str(v) for k, v in static.items()}
    for parent in parents:
        where = f"warm_start_config parent {parent!r}"
        try:
            config, state = tstore.config(parent), tstore.state(parent)
        except ConfigError:
            problems.append(f"{where}: no such tuning job in {tstore.root} (`hora job tune list` shows them)")
            continue
        if state["status"] not in TERMINAL:
            problems.append(f"{where} is {state['status']}: a parent must have ended (Completed, Stopped or "
                            f"Failed); wait for it or stop it (hora job tune stop {parent})")
        cfg = config["HyperParameterTuningJobConfig"]
        parent_metric = cfg["HyperParameterTuningJobObjective"]["MetricName"]
        if parent_metric != metric:
            problems.append(f"{where} tuned objective {parent_metric!r}, not {metric!r}: a warm start keeps the "
                            "objective metric")
        parent_ranges = ranges_from_dict(cfg["ParameterRanges"])
        parent_static = dict(config["TrainingJobDefinition"]["StaticHyperParameters"])
        before, after = len(set(parent_ranges) | set(parent_static)), len(set(ranges) | set(static_s))
        if before != after:
            problems.append(f"{where} has {before} static and tuned hyperparameters, this tuning job {after}: a warm "
                            "start keeps their number (make one static or tuned instead of adding or dropping it)")
        for name, r in ranges.items():
            if name in parent_ranges and parent_ranges[name].__name__ != r.__name__:
                problems.append(f"{where} tuned {name} as {parent_ranges[name].__name__}, this tuning job as "
                                f"{r.__name__}: a warm start keeps each hyperparameter's type")
        changes = _changes(parent_ranges, parent_static, ranges, static_s)
        if changes > MAX_CHANGES:
            problems.append(f"{where}: {changes} changes from tuned to static hyperparameters and of static values "
                            f"(at most {MAX_CHANGES}): keep more of them as they were")
        if warm_type == "IdenticalDataAndAlgorithm":
            theirs = config.get("template") or {}
            differ = [k for k in _SAME if theirs.get(k) != template.get(k)]
            if differ:
                problems.append(f"{where} ran another training script or data ({', '.join(differ)} differ): "
                                "IdenticalDataAndAlgorithm needs the same; use TransferLearning")
    return problems


def parent_trials(tstore: TuningStore, parents: list[str]) -> list[dict[str, Any]]:
    """The parents' own trials that ended with an objective (Completed or Stopped), each as its parent recorded it
    plus ``tuning_job`` (the parent) and ``hyperparameters`` (static and tuned, as strings). A parent that is gone
    is skipped."""
    out = []
    for parent in sorted(parents):
        try:
            config, state = tstore.config(parent), tstore.state(parent)
        except ConfigError:
            continue
        static = config["TrainingJobDefinition"]["StaticHyperParameters"]
        for trial in state["trials"]:
            if trial["status"] in ("Completed", "Stopped") and trial.get("objective") is not None:
                hps = {**static, **{k: str(v) for k, v in trial["tuned"].items()}}
                out.append({**trial, "tuning_job": parent, "hyperparameters": hps})
    return out
