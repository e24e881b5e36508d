"""``hora job``: a local-first runner of the SageMaker script-mode contract (see docs/jobs.md).

>>> from hora.jobs import Estimator
>>> est = Estimator(entry_point="train.py", instance_count=2, processes_per_host=2,
...                 distribution="mpi", hyperparameters={"epochs": 3})   # doctest: +SKIP
>>> est.fit({"training": "data/"})                                      # doctest: +SKIP
"""

from __future__ import annotations

from hora.errors import SpecError, UnexpectedStatusException
from hora.jobs.api import start_job, stop_job, wait_job
from hora.jobs.estimator import Estimator, MXNet, PyTorch, TensorFlow, TrainingJob
from hora.jobs.export_spec import TensorBoardOutputConfig
from hora.jobs.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter
from hora.jobs.spec import ChannelSpec, JobSpec, MetricDefinition, load_spec, parse_spec
from hora.jobs.store import JobRecord, JobStore
from hora.jobs.tuner import (
    HyperbandStrategyConfig,
    HyperparameterTuner,
    HyperparameterTuningJobAnalytics,
    StrategyConfig,
    TuningJobCompletionCriteriaConfig,
    WarmStartConfig,
    WarmStartTypes,
)

__all__ = [
    "CategoricalParameter",
    "ChannelSpec",
    "ContinuousParameter",
    "Estimator",
    "HyperbandStrategyConfig",
    "HyperparameterTuner",
    "HyperparameterTuningJobAnalytics",
    "IntegerParameter",
    "JobRecord",
    "JobSpec",
    "JobStore",
    "MXNet",
    "MetricDefinition",
    "PyTorch",
    "SpecError",
    "StrategyConfig",
    "TensorBoardOutputConfig",
    "TensorFlow",
    "TrainingJob",
    "TuningJobCompletionCriteriaConfig",
    "UnexpectedStatusException",
    "WarmStartConfig",
    "WarmStartTypes",
    "load_spec",
    "parse_spec",
    "start_job",
    "stop_job",
    "wait_job",
]
