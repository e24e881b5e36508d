"""A tuning job's completion criteria (``TuningJobCompletionCriteriaConfig``): when it ends ``Completed`` before
``max_jobs`` trials.

The criteria look at the final objectives of the tuning job's own trials that ended with one (Completed or
Stopped; failed trials have none), in the order they ended:

- ``TargetObjectiveMetricValue``: a trial's final objective reached the target (``>=`` when maximizing, ``<=``
  when minimizing);
- ``MaxNumberOfTrainingJobsNotImproving`` N (>= 3): the last N trials did not improve the best objective by 1% or
  more (SageMaker's definition: a trial improves when it beats the best so far by at least 1% of its magnitude);
- ``CompleteOnConvergence``: hora's rule (SageMaker does not publish its own): once at least
  :data:`CONVERGENCE_MIN_TRIALS` trials ended, the best of all of them is not 1% better than the best of the
  first half of them (the later half of the search found nothing worth going on for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CONVERGENCE_MIN_TRIALS", "IMPROVEMENT", "NOT_IMPROVING_MIN", "CompletionCriteria", "completion_problems",
           "converged", "improves", "not_improving"]

#: A trial improves the best when it beats it by at least this fraction of its magnitude.
IMPROVEMENT = 0.01
#: BestObjectiveNotImproving's smallest MaxNumberOfTrainingJobsNotImproving.
NOT_IMPROVING_MIN = 3
#: hora's convergence rule judges once this many trials have ended with an objective.
CONVERGENCE_MIN_TRIALS = 10


def improves(value: float, best: float | None, maximize: bool) -> bool:
    """Whether ``value`` beats ``best`` by at least 1% of ``|best|`` (any value improves on no best; with a best
    of 0 any better value does)."""
    if best is None:
        return True
    margin = IMPROVEMENT * abs(best)
    return value > best + margin if maximize else value < best - margin


def _best(values: Sequence[float], maximize: bool) -> float:
    return max(values) if maximize else min(values)


def not_improving(values: Sequence[float], maximize: bool) -> int:
    """How many trials in a row, up to the last, did not improve the best by 1% or more
    (TuningJobCompletionDetails' ``NumberOfTrainingJobsObjectiveNotImproving``). A trial better by less than 1%
    becomes the best and still counts as not improving."""
    best: float | None = None
    count = 0
    for value in values:
        if improves(value, best, maximize):
            count = 0
        else:
            count += 1
        best = value if best is None else _best([best, value], maximize)
    return count


def converged(values: Sequence[float], maximize: bool) -> bool:
    """hora's convergence rule (see the module's docstring)."""
    if len(values) < CONVERGENCE_MIN_TRIALS:
        return False
    return not improves(_best(values, maximize), _best(values[: len(values) // 2], maximize), maximize)


@dataclass(frozen=True)
class CompletionCriteria:
    """HyperParameterTuningJobConfig's ``TuningJobCompletionCriteria``, as decided by the supervisor."""

    target: float | None = None
    max_not_improving: int | None = None
    on_convergence: bool = False

    @classmethod
    def from_request(cls, request: dict[str, Any] | None) -> CompletionCriteria | None:
        if not request:
            return None
        return cls(target=request.get("TargetObjectiveMetricValue"),
                   max_not_improving=(request.get("BestObjectiveNotImproving") or {}).get(
                       "MaxNumberOfTrainingJobsNotImproving"),
                   on_convergence=(request.get("ConvergenceDetected") or {}).get("CompleteOnConvergence") == "Enabled")

    def met(self, values: Sequence[float], maximize: bool) -> str | None:
        """Why the tuning job is complete, given its trials' final objectives in the order they ended, or None."""
        if not values:
            return None
        if self.target is not None:
            reached = [v for v in values if (v >= self.target if maximize else v <= self.target)]
            if reached:
                return (f"TargetObjectiveMetricValue ({self.target:g}) was reached: a trial's objective is "
                        f"{reached[0]:g}")
        if self.max_not_improving is not None and not_improving(values, maximize) >= self.max_not_improving:
            return (f"BestObjectiveNotImproving: the last {self.max_not_improving} trials did not improve the best "
                    "objective by 1% or more")
        if self.on_convergence and converged(values, maximize):
            return (f"ConvergenceDetected: the best objective of {len(values)} trials is not 1% better than the best "
                    f"of the first {len(values) // 2}")
        return None


def completion_problems(config: Any) -> list[str]:
    """The problems of a ``completion_criteria_config`` (the service's rules), each naming the field and the fix."""
    from hora.jobs.tuner_configs import TuningJobCompletionCriteriaConfig

    if config is None:
        return []
    if not isinstance(config, TuningJobCompletionCriteriaConfig):
        return [f"completion_criteria_config must be a TuningJobCompletionCriteriaConfig, got {type(config).__name__}"]
    problems = []
    n = config.max_number_of_training_jobs_not_improving
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < NOT_IMPROVING_MIN):
        problems.append(f"completion_criteria_config max_number_of_training_jobs_not_improving must be a whole "
                        f"number >= {NOT_IMPROVING_MIN}, got {n!r}")
    target = config.target_objective_metric_value
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not math.isfinite(target)):
        problems.append(f"completion_criteria_config target_objective_metric_value must be a number, got {target!r}")
    if config.complete_on_convergence is not None and not isinstance(config.complete_on_convergence, bool):
        problems.append(f"completion_criteria_config complete_on_convergence must be True or False, got "
                        f"{config.complete_on_convergence!r}")
    return problems
