"""What ``hora job tune list / describe`` print: readable text from the tuning jobs' state (:mod:`.tuning_store`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hora.jobs.tuning_describe import best_trial
from hora.jobs.tuning_store import TuningStore

__all__ = ["tuning_describe", "tuning_overview", "tuning_summary", "tuning_table"]


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _objective(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def tuning_overview(tstore: TuningStore, name: str) -> dict[str, Any]:
    """What a line of ``hora job tune list`` (and of the dashboard's list) says of a tuning job: its ``config`` and
    ``state``, the trials ended (``done``) of ``max_jobs``, and the ``best`` trial (None before one has ended)."""
    config, state = tstore.config(name), tstore.state(name)
    cfg = config["HyperParameterTuningJobConfig"]
    return {
        "config": config,
        "state": state,
        "done": sum(t["status"] != "InProgress" for t in state["trials"]),
        "max_jobs": cfg["ResourceLimits"]["MaxNumberOfTrainingJobs"],
        "best": best_trial(state["trials"], cfg["HyperParameterTuningJobObjective"]["Type"] == "Maximize"),
    }


def tuning_table(tstore: TuningStore) -> str:
    names = tstore.names()
    if not names:
        return "no tuning jobs yet (hora job tune SPEC starts one)"
    rows = [("NAME", "STATUS", "STRATEGY", "TRIALS", "BEST", "CREATED")]
    for name in names:
        o = tuning_overview(tstore, name)
        best = o["best"]
        rows.append((name, o["state"]["status"], o["config"]["HyperParameterTuningJobConfig"]["Strategy"],
                     f"{o['done']}/{o['max_jobs']}",
                     "-" if best is None else f"{_objective(best['objective'])} ({best['name']})",
                     _when(o["config"]["created"])))
    return "\n".join(_table(rows))


def _range_text(r: dict[str, Any]) -> str:
    if "Values" in r:
        return f"{r['Name']}: one of {', '.join(r['Values'])}"
    return f"{r['Name']}: {r['MinValue']} .. {r['MaxValue']} ({r['ScalingType']})"


def tuning_summary(tstore: TuningStore, name: str) -> str:
    """The few lines printed when a tuning job ends."""
    state, config = tstore.state(name), tstore.config(name)
    objective = config["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]
    best = best_trial(state["trials"], objective["Type"] == "Maximize")
    lines = [f"tuning job {name}: {state['status']}, {len(state['trials'])} trial(s)"]
    if best is not None:
        lines.append(f"best: {best['name']} {objective['MetricName']}={_objective(best['objective'])} "
                     f"{best['tuned']}")
    if state.get("failure_reason"):
        lines.append(f"reason: {state['failure_reason']}")
    return "\n".join(lines)


def tuning_describe(tstore: TuningStore, name: str) -> str:
    config, state = tstore.config(name), tstore.state(name)
    cfg = config["HyperParameterTuningJobConfig"]
    objective = cfg["HyperParameterTuningJobObjective"]
    limits = cfg["ResourceLimits"]
    lines = [
        f"Name:              {name}",
        f"Status:            {state['status']}",
        f"Strategy:          {cfg['Strategy']}" + (f" (seed {cfg['RandomSeed']})" if "RandomSeed" in cfg else ""),
        f"Objective:         {objective['Type']} {objective['MetricName']}",
        f"Trials:            {limits['MaxNumberOfTrainingJobs']}, at most {limits['MaxParallelTrainingJobs']} at once"
        + (f", within {limits['MaxRuntimeInSeconds']} s" if "MaxRuntimeInSeconds" in limits else ""),
        f"Early stopping:    {cfg['TrainingJobEarlyStoppingType']}",
        *([f"Trials run on:     the Ray cluster at {config['ray']['address']}"] if config.get("ray") else []),
        f"Created:           {_when(config['created'])}",
        f"Ended:             {_when(state.get('ended'))}",
    ]
    if state.get("failure_reason"):
        lines.append(f"Reason:            {state['failure_reason']}")
    lines.append("Ranges:")
    lines += [f"  {_range_text(r)}" for group in cfg["ParameterRanges"].values() for r in group]
    static = config["TrainingJobDefinition"]["StaticHyperParameters"]
    if static:
        lines.append(f"Static:            {', '.join(f'{k}={v}' for k, v in sorted(static.items()))}")
    best = best_trial(state["trials"], objective["Type"] == "Maximize")
    if best is not None:
        lines.append(f"Best trial:        {best['name']} ({objective['MetricName']}={_objective(best['objective'])})")
    if state["trials"]:
        lines.append("Trials:")
        names = [r["Name"] for group in cfg["ParameterRanges"].values() for r in group]
        rows = [("NAME", "STATUS", "OBJECTIVE", *names)]
        rows += [(t["name"], t["status"], _objective(t["objective"]), *(str(t["tuned"].get(n, "")) for n in names))
                 for t in state["trials"]]
        lines += [f"  {line}" for line in _table(rows)]
        for t in state["trials"]:
            if t.get("failure_reason"):
                lines.append(f"  {t['name']}: {t['failure_reason'].splitlines()[0]}")
    return "\n".join(lines)
