"""The SageMaker SDK's tuning configuration classes (``sagemaker.tuner``), with the SDK's constructors, checks and
request forms (``to_input_req`` / ``from_job_desc``), so scripts that build them import unchanged. What they do in
hora: Hyperband in :mod:`.hyperband`, warm start in :mod:`.warm_start`, completion criteria in :mod:`.completion`
(docs/tuning.md)."""

from __future__ import annotations

import enum
from typing import Any

from hora.errors import ConfigError

__all__ = ["HyperbandStrategyConfig", "StrategyConfig", "TuningJobCompletionCriteriaConfig", "WarmStartConfig",
           "WarmStartTypes"]


class WarmStartTypes(enum.Enum):
    IDENTICAL_DATA_AND_ALGORITHM = "IdenticalDataAndAlgorithm"
    TRANSFER_LEARNING = "TransferLearning"


class WarmStartConfig:
    """A tuning job's parents (at most 5 ended tuning jobs) and how their results are reused."""

    def __init__(self, warm_start_type: WarmStartTypes, parents: Any) -> None:
        if warm_start_type not in list(WarmStartTypes):
            raise ConfigError(f"Invalid type: {warm_start_type}, valid warm start types are: {list(WarmStartTypes)}")
        if not parents:
            raise ConfigError(f"Invalid parents: {parents}, parents should not be None/empty")
        self.type = warm_start_type
        self.parents = set(parents)

    @classmethod
    def from_job_desc(cls, warm_start_config: Any) -> WarmStartConfig | None:
        """From DescribeHyperParameterTuningJob's ``WarmStartConfig`` (None when it has none)."""
        if (not warm_start_config or "WarmStartType" not in warm_start_config
                or "ParentHyperParameterTuningJobs" not in warm_start_config):
            return None
        parents = [p["HyperParameterTuningJobName"] for p in warm_start_config["ParentHyperParameterTuningJobs"]]
        return cls(warm_start_type=WarmStartTypes(warm_start_config["WarmStartType"]), parents=parents)

    def to_input_req(self) -> dict[str, Any]:
        return {"WarmStartType": self.type.value,
                "ParentHyperParameterTuningJobs": [{"HyperParameterTuningJobName": p} for p in sorted(self.parents)]}


class HyperbandStrategyConfig:
    """Hyperband's resources (epochs): a trial is never stopped before ``min_resource``, and runs at most
    ``max_resource`` (by default the static ``epochs``-like hyperparameter)."""

    def __init__(self, max_resource: int | None = None, min_resource: int | None = None) -> None:
        self.min_resource = min_resource
        self.max_resource = max_resource

    @classmethod
    def from_job_desc(cls, hyperband_strategy_config: dict[str, Any]) -> HyperbandStrategyConfig:
        return cls(min_resource=hyperband_strategy_config.get("MinResource"),
                   max_resource=hyperband_strategy_config.get("MaxResource"))

    def to_input_req(self) -> dict[str, Any]:
        return {"MinResource": self.min_resource, "MaxResource": self.max_resource}


class StrategyConfig:
    def __init__(self, hyperband_strategy_config: HyperbandStrategyConfig) -> None:
        self.hyperband_strategy_config = hyperband_strategy_config

    @classmethod
    def from_job_desc(cls, strategy_config: dict[str, Any]) -> StrategyConfig:
        return cls(hyperband_strategy_config=HyperbandStrategyConfig.from_job_desc(
            strategy_config["HyperbandStrategyConfig"]))

    def to_input_req(self) -> dict[str, Any]:
        return {"HyperbandStrategyConfig": self.hyperband_strategy_config.to_input_req()}


class TuningJobCompletionCriteriaConfig:
    """When a tuning job ends Completed before ``max_jobs`` trials: a trial reached the target, or N trials in a
    row did not improve the best, or the search converged (hora's rule: docs/tuning.md)."""

    def __init__(self, max_number_of_training_jobs_not_improving: int | None = None,
                 complete_on_convergence: bool | None = None,
                 target_objective_metric_value: float | None = None) -> None:
        self.max_number_of_training_jobs_not_improving = max_number_of_training_jobs_not_improving
        self.complete_on_convergence = complete_on_convergence
        self.target_objective_metric_value = target_objective_metric_value

    @classmethod
    def from_job_desc(cls, completion_criteria_config: dict[str, Any]) -> TuningJobCompletionCriteriaConfig:
        """From HyperParameterTuningJobConfig's ``TuningJobCompletionCriteria`` (the SDK's reading, field by
        field)."""
        complete_on_convergence = None
        convergence = completion_criteria_config.get("ConvergenceDetected") or {}
        if convergence.get("CompleteOnConvergence"):
            complete_on_convergence = convergence["CompleteOnConvergence"] == "Enabled"
        not_improving = (completion_criteria_config.get("BestObjectiveNotImproving") or {}).get(
            "MaxNumberOfTrainingJobsNotImproving") or None
        return cls(max_number_of_training_jobs_not_improving=not_improving,
                   complete_on_convergence=complete_on_convergence,
                   target_objective_metric_value=completion_criteria_config.get("TargetObjectiveMetricValue"))

    def to_input_req(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_number_of_training_jobs_not_improving is not None:
            out["BestObjectiveNotImproving"] = {
                "MaxNumberOfTrainingJobsNotImproving": self.max_number_of_training_jobs_not_improving}
        if self.target_objective_metric_value is not None:
            out["TargetObjectiveMetricValue"] = self.target_objective_metric_value
        if self.complete_on_convergence is not None:
            out["ConvergenceDetected"] = {
                "CompleteOnConvergence": "Enabled" if self.complete_on_convergence else "Disabled"}
        return out
