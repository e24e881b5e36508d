"""The SageMaker SDK's tuning configuration classes (``sagemaker.tuner``), with the SDK's constructors and checks,
so scripts that build them import unchanged. hora's tuner does not run warm starts, Hyperband or completion
criteria yet: passing one to :class:`~hora.jobs.HyperparameterTuner` says so (docs/tuning.md)."""

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
    def __init__(self, warm_start_type: WarmStartTypes, parents: Any) -> None:
        if warm_start_type not in list(WarmStartTypes):
            raise ConfigError(f"Invalid type: {warm_start_type}, valid warm start types are: {list(WarmStartTypes)}")
        if not parents:
            raise ConfigError(f"Invalid parents: {parents}, parents should not be None/empty")
        self.type = warm_start_type
        self.parents = set(parents)


class HyperbandStrategyConfig:
    def __init__(self, max_resource: int, min_resource: int) -> None:
        self.min_resource = min_resource
        self.max_resource = max_resource


class StrategyConfig:
    def __init__(self, hyperband_strategy_config: HyperbandStrategyConfig) -> None:
        self.hyperband_strategy_config = hyperband_strategy_config


class TuningJobCompletionCriteriaConfig:
    def __init__(self, max_number_of_training_jobs_not_improving: int | None = None,
                 complete_on_convergence: bool | None = None,
                 target_objective_metric_value: float | None = None) -> None:
        self.max_number_of_training_jobs_not_improving = max_number_of_training_jobs_not_improving
        self.complete_on_convergence = complete_on_convergence
        self.target_objective_metric_value = target_objective_metric_value
