"""The SageMaker SDK's ``HyperparameterTuner`` (``sagemaker.tuner``), run by hora on this machine: each trial is an
ordinary hora job (``hora job list/describe/logs``), the tuning job runs in a detached supervisor process
(:mod:`.tuning`) and lives in the jobs home (:mod:`.tuning_store`), so it outlives the Python process that started
it and :meth:`HyperparameterTuner.attach` finds it from any other.

>>> tuner = HyperparameterTuner(estimator, "validation:accuracy",
...                             {"lr": ContinuousParameter(1e-4, 1e-1, "Logarithmic")},
...                             metric_definitions=[{"Name": "validation:accuracy", "Regex": "acc=([0-9.]+)"}],
...                             strategy="Random", max_jobs=6, max_parallel_jobs=2)   # doctest: +SKIP
>>> tuner.fit({"training": "data/"})                                                  # doctest: +SKIP
>>> tuner.best_training_job(), tuner.analytics().dataframe()                          # doctest: +SKIP

Differences from SageMaker are listed in docs/tuning.md.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import time
import uuid
from pathlib import Path
from typing import Any

from hora.errors import ConfigError, SpecError, UnexpectedStatusException
from hora.jobs.completion import completion_problems
from hora.jobs.estimator import Estimator, TrainingJob
from hora.jobs.hyperband import hyperband_problems
from hora.jobs.parameter import ParameterRange, check_ranges, ranges_from_dict, ranges_to_dict
from hora.jobs.search import grid_size, make_search
from hora.jobs.spec import parse_spec
from hora.jobs.store import JobStore
from hora.jobs.tuner_configs import (
    HyperbandStrategyConfig,
    StrategyConfig,
    TuningJobCompletionCriteriaConfig,
    WarmStartConfig,
    WarmStartTypes,
)
from hora.jobs.tuning import start_tuning_job, stop_tuning_job, wait_tuning_job
from hora.jobs.tuning_analytics import HyperparameterTuningJobAnalytics
from hora.jobs.tuning_describe import describe_tuning_job
from hora.jobs.tuning_store import TuningStore
from hora.jobs.warm_start import parent_problems, warm_start_problems

__all__ = [
    "HyperbandStrategyConfig",
    "HyperparameterTuner",
    "HyperparameterTuningJobAnalytics",
    "StrategyConfig",
    "TuningJobCompletionCriteriaConfig",
    "WarmStartConfig",
    "WarmStartTypes",
    "ray_problems",
    "tuning_problems",
]

log = logging.getLogger("hora")

STRATEGIES = ("Bayesian", "Random", "Hyperband", "Grid")
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}$")  # HyperParameterTuningJobName's pattern


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def tuning_problems(ranges: Any, static: dict[str, Any], metric_names: list[str], objective_metric_name: Any,
                    strategy: Any, objective_type: Any, max_jobs: Any, max_parallel_jobs: Any,
                    max_runtime_in_seconds: Any, early_stopping_type: Any, random_seed: Any,
                    strategy_config: Any = None, completion_criteria_config: Any = None,
                    warm_start_config: Any = None) -> list[str]:
    """Every problem of a tuning job's settings (the service's CreateHyperParameterTuningJob rules), each naming
    the argument and the fix; empty when they are valid (a warm start's parents are checked when it starts)."""
    problems = check_ranges(ranges, static)
    if strategy not in STRATEGIES:
        problems.append(f"strategy {strategy!r} must be one of {', '.join(STRATEGIES)}")
    elif strategy == "Hyperband" and early_stopping_type != "Off":
        problems.append("early_stopping_type must be 'Off' with the Hyperband strategy (Hyperband stops "
                        "trials itself)")
    if strategy in STRATEGIES:
        problems += hyperband_problems(strategy, strategy_config, static,
                                       list(ranges) if isinstance(ranges, dict) else [])[0]
    problems += completion_problems(completion_criteria_config)
    problems += warm_start_problems(warm_start_config)
    if objective_type not in ("Maximize", "Minimize"):
        problems.append(f"objective_type {objective_type!r} must be 'Maximize' or 'Minimize'")
    if early_stopping_type not in ("Off", "Auto"):
        problems.append(f"early_stopping_type {early_stopping_type!r} must be 'Off' or 'Auto'")
    if not isinstance(objective_metric_name, str) or not objective_metric_name:
        problems.append(f"objective_metric_name must be a metric's name, got {objective_metric_name!r}")
    elif objective_metric_name not in metric_names:
        known = ", ".join(repr(n) for n in metric_names) or "none"
        problems.append(f"objective_metric_name {objective_metric_name!r} is not among the metric_definitions' "
                        f"names ({known}): add {{'Name': {objective_metric_name!r}, 'Regex': ...}} to "
                        "metric_definitions so the trials' logs give its values")
    if strategy == "Grid":
        if max_jobs is not None:
            problems.append(f"max_jobs={max_jobs!r}: the Grid strategy runs every combination of the categorical "
                            "values once and computes max_jobs itself; leave max_jobs out")
        if isinstance(ranges, dict):
            other = sorted(n for n, r in ranges.items() if r.__name__ != "Categorical")
            if other:
                problems.append(f"the Grid strategy takes CategoricalParameter ranges only; {', '.join(other)} "
                                "must be CategoricalParameter (list the values to try) or use another strategy")
    elif max_jobs is not None and not _positive_int(max_jobs):
        problems.append(f"max_jobs must be a whole number >= 1, got {max_jobs!r}")
    if not _positive_int(max_parallel_jobs):
        problems.append(f"max_parallel_jobs must be a whole number >= 1, got {max_parallel_jobs!r}")
    if max_runtime_in_seconds is not None and not _positive_int(max_runtime_in_seconds):
        problems.append(f"max_runtime_in_seconds must be a whole number of seconds >= 1, got "
                        f"{max_runtime_in_seconds!r}")
    if random_seed is not None and (not isinstance(random_seed, int) or isinstance(random_seed, bool)
                                    or random_seed < 0):
        problems.append(f"random_seed must be a whole number >= 0, got {random_seed!r}")
    return problems


def ray_problems(ray_address: Any, ray_resources: Any) -> list[str]:
    """The problems of hora's Ray settings of a tuning job (``ray_address``, ``ray_resources``: docs/tuning.md)."""
    problems = []
    if ray_address is not None and (not isinstance(ray_address, str) or not ray_address.strip()):
        problems.append(f"ray_address must be a Ray cluster's address ('auto', 'HOST:PORT' or 'ray://HOST:PORT'), got "
                        f"{ray_address!r}")
    if ray_resources is not None:
        if ray_address is None:
            problems.append("ray_resources is for trials on a Ray cluster: set ray_address too, or leave it out")
        if not isinstance(ray_resources, dict) or not ray_resources or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                for k, v in ray_resources.items()):
            problems.append(f"ray_resources must map Ray resource names to amounts >= 0, e.g. {{'CPU': 2, 'GPU': 1}}, "
                            f"got {ray_resources!r}")
    if ray_address is not None and importlib.util.find_spec("ray") is None:
        problems.append("ray_address: trials on a Ray cluster need Ray: pip install -c constraints.txt -e '.[ray]' in "
                        "hora's checkout")
    return problems


class _TuningJob:
    """``tuner.latest_tuning_job``: the SDK's ``_TuningJob`` for a tuning job of this machine's store."""

    def __init__(self, tstore: TuningStore, name: str) -> None:
        self._tstore = tstore
        self.name = name

    def describe(self) -> dict[str, Any]:
        return describe_tuning_job(self._tstore, self.name)

    def stop(self) -> None:
        stop_tuning_job(self._tstore, self.name)

    def wait(self) -> None:
        """Wait until the tuning job ends; a Failed one raises UnexpectedStatusException (as the SDK)."""
        state = wait_tuning_job(self._tstore, self.name)
        if state["status"] == "Failed":
            reason = state.get("failure_reason") or "(No reason provided)"
            raise UnexpectedStatusException(
                f"Error for HyperParameterTuning job {self.name}: Failed. Reason: {reason}",
                allowed_statuses=["Completed", "Stopped"], actual_status="Failed")


class HyperparameterTuner:
    """SageMaker's ``HyperparameterTuner``, run on this machine (the SDK's arguments; see the module's docstring).

    hora's own arguments: ``ray_address`` places the trials on a Ray cluster (``"auto"`` or an address, as
    ``ray.init`` takes it), each trial on a node with ``ray_resources`` (default: one CPU per process of the trial).

    ``tags`` has no effect; ``estimator_name``, ``autotune`` and ``hyperparameters_to_keep_static`` are not
    supported yet and say so.
    """

    TUNING_JOB_NAME_MAX_LENGTH = 32

    def __init__(
        self,
        estimator: Estimator,
        objective_metric_name: str,
        hyperparameter_ranges: dict[str, ParameterRange],
        metric_definitions: list[dict[str, str]] | None = None,
        strategy: str = "Bayesian",
        objective_type: str = "Maximize",
        max_jobs: int | None = None,
        max_parallel_jobs: int = 1,
        max_runtime_in_seconds: int | None = None,
        tags: Any = None,
        base_tuning_job_name: str | None = None,
        warm_start_config: WarmStartConfig | None = None,
        strategy_config: StrategyConfig | None = None,
        completion_criteria_config: TuningJobCompletionCriteriaConfig | None = None,
        early_stopping_type: str = "Off",
        estimator_name: str | None = None,
        random_seed: int | None = None,
        autotune: bool = False,
        hyperparameters_to_keep_static: list[str] | None = None,
        ray_address: str | None = None,
        ray_resources: dict[str, float] | None = None,
    ) -> None:
        if not hyperparameter_ranges and not autotune:
            raise ConfigError("Need to specify hyperparameter ranges or set autotune=True.")
        unsupported = [n for n, v in (("estimator_name", estimator_name), ("autotune", autotune or None),
                                      ("hyperparameters_to_keep_static", hyperparameters_to_keep_static))
                       if v is not None]
        if unsupported:
            raise ConfigError(f"{', '.join(unsupported)}: not supported by hora's tuner yet (docs/tuning.md lists "
                              "what is not done); leave them out")
        if tags:
            log.warning("hora tunes on this machine: tags have no effect here")
        self.estimator = estimator
        self.objective_metric_name = objective_metric_name
        self._hyperparameter_ranges = dict(hyperparameter_ranges)
        self.metric_definitions = metric_definitions
        self.strategy = strategy
        self.objective_type = objective_type
        self.max_jobs = max_jobs if max_jobs is not None or strategy == "Grid" else 1  # the SDK's default
        self.max_parallel_jobs = max_parallel_jobs
        self.max_runtime_in_seconds = max_runtime_in_seconds
        self.base_tuning_job_name = base_tuning_job_name
        self.early_stopping_type = early_stopping_type
        self.random_seed = random_seed
        self.warm_start_config = warm_start_config
        self.strategy_config = strategy_config
        self.completion_criteria_config = completion_criteria_config
        self.latest_tuning_job: _TuningJob | None = None
        self._current_job_name: str | None = None
        self._tstore = TuningStore(estimator.store)
        self.ray_address = ray_address
        self.ray_resources = ray_resources
        problems = tuning_problems(
            self._hyperparameter_ranges, self.static_hyperparameters(), self._metric_names(), objective_metric_name,
            strategy, objective_type, max_jobs, max_parallel_jobs, max_runtime_in_seconds, early_stopping_type,
            random_seed, strategy_config, completion_criteria_config, warm_start_config) + ray_problems(
            ray_address, ray_resources)
        if problems:
            raise SpecError(problems, "the HyperparameterTuner")

    def _metric_definitions(self) -> list[dict[str, str]]:
        """The tuner's metric definitions, else the estimator's (each trial parses its logs with them)."""
        if self.metric_definitions is not None:
            return list(self.metric_definitions)
        return list(self.estimator.fields.get("metric_definitions") or [])

    def _metric_names(self) -> list[str]:
        return [str(m.get("Name")) for m in self._metric_definitions() if isinstance(m, dict)]

    def static_hyperparameters(self) -> dict[str, Any]:
        """The estimator's hyperparameters less the tuned ones (the SDK's ``_prepare_static_hyperparameters``)."""
        hps = self.estimator.fields.get("hyperparameters") or {}
        return {k: v for k, v in hps.items() if k not in self._hyperparameter_ranges}

    def hyperparameter_ranges(self) -> dict[str, Any]:
        """The ranges as CreateHyperParameterTuningJob's ``ParameterRanges``."""
        return ranges_to_dict(self._hyperparameter_ranges)

    def _job_name(self, job_name: str | None) -> str:
        if job_name is not None:
            if not _NAME.match(job_name):
                raise ConfigError(f"job_name {job_name!r}: a tuning job's name is 1-32 letters, digits and hyphens, "
                                  "starting with a letter or digit")
            return job_name
        base = self.base_tuning_job_name or Path(str(self.estimator.fields.get("entry_point", "tuning"))).stem
        base = re.sub(r"[^A-Za-z0-9]+", "-", base).strip("-") or "tuning"
        suffix = f"{time.strftime('%y%m%d-%H%M')}-{uuid.uuid4().hex[:4]}"
        return f"{base[: self.TUNING_JOB_NAME_MAX_LENGTH - len(suffix) - 1].strip('-')}-{suffix}"

    def fit(self, inputs: Any = None, job_name: str | None = None, include_cls_metadata: Any = False,
            estimator_kwargs: Any = None, wait: bool = True, **kwargs: Any) -> None:
        """Start the tuning job (its trials run the estimator with ``inputs``, as ``Estimator.fit`` takes them); with
        ``wait``, block until it ends."""
        name = self._job_name(job_name)
        data = dict(self.estimator.fields)
        config = self.tuning_config(name)
        data["hyperparameters"] = self.static_hyperparameters()
        hyperband = config.get("hyperband")
        if hyperband is not None and hyperband["epochs_key"] is not None:
            data["hyperparameters"][hyperband["epochs_key"]] = hyperband["max_resource"]
        data["metric_definitions"] = self._metric_definitions()
        if inputs is not None:
            data["inputs"] = {"training": inputs} if isinstance(inputs, str) else dict(inputs)
        data["job_name"] = f"{name}-000-00000000"
        spec = parse_spec(data, source="the HyperparameterTuner's estimator")
        config["template"] = spec.to_dict()
        config["TrainingJobDefinition"].update(
            ResourceConfig={"InstanceType": spec.instance_type, "InstanceCount": spec.instance_count},
            StoppingCondition={"MaxRuntimeInSeconds": spec.max_run})
        fields = {**self.estimator.fields, "source_dir": spec.source_dir, "entry_point": spec.entry_point}
        for key in ("output_path", "checkpoint_path"):
            if getattr(spec, key):
                fields[key] = getattr(spec, key)
        config["estimator"] = json.loads(json.dumps(fields, default=str))
        if self.warm_start_config is not None:
            problems = parent_problems(
                self._tstore, self.warm_start_config.type.value, sorted(self.warm_start_config.parents),
                self.objective_metric_name, self._hyperparameter_ranges, self.static_hyperparameters(),
                config["template"])
            if problems:
                raise SpecError(problems, f"the warm start of tuning job {name!r}")
        cfg = config["HyperParameterTuningJobConfig"]
        make_search(cfg["Strategy"], self._hyperparameter_ranges, True, self.random_seed)  # Optuna is there
        start_tuning_job(self._tstore, name, config)
        self._current_job_name = name
        self.latest_tuning_job = _TuningJob(self._tstore, name)
        if wait:
            self.latest_tuning_job.wait()

    def tuning_config(self, name: str) -> dict[str, Any]:
        """The CreateHyperParameterTuningJob request's fields for this tuner (stored as the job's config)."""
        max_jobs = grid_size(self._hyperparameter_ranges) if self.strategy == "Grid" else self.max_jobs
        limits: dict[str, Any] = {"MaxNumberOfTrainingJobs": max_jobs,
                                  "MaxParallelTrainingJobs": self.max_parallel_jobs}
        if self.max_runtime_in_seconds is not None:
            limits["MaxRuntimeInSeconds"] = self.max_runtime_in_seconds
        cfg: dict[str, Any] = {
            "Strategy": self.strategy,
            "HyperParameterTuningJobObjective": {"Type": self.objective_type, "MetricName": self.objective_metric_name},
            "ResourceLimits": limits,
            "ParameterRanges": self.hyperparameter_ranges(),
            "TrainingJobEarlyStoppingType": self.early_stopping_type,
        }
        if self.random_seed is not None:
            cfg["RandomSeed"] = self.random_seed
        hyperband = hyperband_problems(self.strategy, self.strategy_config, self.static_hyperparameters(),
                                       list(self._hyperparameter_ranges))[1]
        if self.strategy_config is not None:
            cfg["StrategyConfig"] = {"HyperbandStrategyConfig": {
                k: v for k, v in self.strategy_config.hyperband_strategy_config.to_input_req().items()
                if v is not None}}
        if self.completion_criteria_config is not None:
            cfg["TuningJobCompletionCriteria"] = self.completion_criteria_config.to_input_req()
        static = self.static_hyperparameters()
        if hyperband is not None and hyperband["epochs_key"] is not None:  # every trial may run max_resource
            static[hyperband["epochs_key"]] = hyperband["max_resource"]
        out: dict[str, Any] = {
            "HyperParameterTuningJobName": name,
            "created": time.time(),
            "ray": None if self.ray_address is None else {"address": self.ray_address,
                                                          "resources": self.ray_resources},
            "HyperParameterTuningJobConfig": cfg,
            "TrainingJobDefinition": {
                "StaticHyperParameters": {str(k): str(v) for k, v in static.items()},
                "AlgorithmSpecification": {"TrainingInputMode": self.estimator.fields.get("input_mode", "File"),
                                           "MetricDefinitions": self._metric_definitions()},
            },
        }
        if hyperband is not None:
            out["hyperband"] = hyperband
        if self.warm_start_config is not None:
            out["WarmStartConfig"] = self.warm_start_config.to_input_req()
        return out

    @classmethod
    def attach(cls, tuning_job_name: str, sagemaker_session: Any = None, job_details: Any = None,
               estimator_cls: Any = None, home: str | None = None) -> HyperparameterTuner:
        """A tuner bound to an existing tuning job of the jobs home (``home``, default ``~/.hora``), from any
        process."""
        tstore = TuningStore(JobStore(home))
        config = tstore.config(tuning_job_name)
        cfg = config["HyperParameterTuningJobConfig"]
        fields = dict(config["estimator"])
        estimator = Estimator(home=str(tstore.jobs.home), **fields)
        tuner = cls(
            estimator, cfg["HyperParameterTuningJobObjective"]["MetricName"], ranges_from_dict(cfg["ParameterRanges"]),
            metric_definitions=config["TrainingJobDefinition"]["AlgorithmSpecification"]["MetricDefinitions"],
            strategy=cfg["Strategy"], objective_type=cfg["HyperParameterTuningJobObjective"]["Type"],
            max_jobs=None if cfg["Strategy"] == "Grid" else cfg["ResourceLimits"]["MaxNumberOfTrainingJobs"],
            max_parallel_jobs=cfg["ResourceLimits"]["MaxParallelTrainingJobs"],
            max_runtime_in_seconds=cfg["ResourceLimits"].get("MaxRuntimeInSeconds"),
            early_stopping_type=cfg["TrainingJobEarlyStoppingType"], random_seed=cfg.get("RandomSeed"),
            warm_start_config=WarmStartConfig.from_job_desc(config.get("WarmStartConfig")),
            strategy_config=StrategyConfig.from_job_desc(cfg["StrategyConfig"]) if "StrategyConfig" in cfg else None,
            completion_criteria_config=(TuningJobCompletionCriteriaConfig.from_job_desc(
                cfg["TuningJobCompletionCriteria"]) if "TuningJobCompletionCriteria" in cfg else None),
            **({"ray_address": config["ray"]["address"], "ray_resources": config["ray"]["resources"]}
               if config.get("ray") else {}))
        tuner._current_job_name = tuning_job_name
        tuner.latest_tuning_job = _TuningJob(tstore, tuning_job_name)
        return tuner

    def _ensure_last_tuning_job(self) -> _TuningJob:
        if self.latest_tuning_job is None:
            raise ConfigError("No tuning job available")
        return self.latest_tuning_job

    def wait(self) -> None:
        self._ensure_last_tuning_job().wait()

    def stop_tuning_job(self) -> None:
        self._ensure_last_tuning_job().stop()

    def transfer_learning_tuner(self, additional_parents: Any = None,
                                estimator: Estimator | None = None) -> HyperparameterTuner:
        """A new tuner with this one's settings, warm started (TransferLearning) from this tuning job and
        ``additional_parents``; ``estimator`` replaces the estimator (another script or data)."""
        return self._create_warm_start_tuner(additional_parents, WarmStartTypes.TRANSFER_LEARNING, estimator)

    def identical_dataset_and_algorithm_tuner(self, additional_parents: Any = None) -> HyperparameterTuner:
        """A new tuner with this one's settings, warm started (IdenticalDataAndAlgorithm) from this tuning job and
        ``additional_parents``."""
        return self._create_warm_start_tuner(additional_parents, WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM)

    def _create_warm_start_tuner(self, additional_parents: Any, warm_start_type: WarmStartTypes,
                                 estimator: Estimator | None = None) -> HyperparameterTuner:
        parents = {self._ensure_last_tuning_job().name} | set(additional_parents or ())
        return HyperparameterTuner(
            estimator=estimator or self.estimator, objective_metric_name=self.objective_metric_name,
            hyperparameter_ranges=self._hyperparameter_ranges, metric_definitions=self.metric_definitions,
            strategy=self.strategy, strategy_config=self.strategy_config,
            completion_criteria_config=self.completion_criteria_config, objective_type=self.objective_type,
            max_jobs=self.max_jobs, max_parallel_jobs=self.max_parallel_jobs,
            max_runtime_in_seconds=self.max_runtime_in_seconds,
            warm_start_config=WarmStartConfig(warm_start_type=warm_start_type, parents=parents),
            early_stopping_type=self.early_stopping_type, random_seed=self.random_seed)

    def describe(self) -> dict[str, Any]:
        """DescribeHyperParameterTuningJob's response for the latest tuning job."""
        return self._ensure_last_tuning_job().describe()

    def _get_best_training_job(self) -> dict[str, Any]:
        job = self._ensure_last_tuning_job()
        try:
            best: dict[str, Any] = job.describe()["BestTrainingJob"]
            return best
        except KeyError:
            raise ConfigError(f"Best training job not available for tuning job: {job.name}") from None

    def best_training_job(self) -> str:
        """The name of the best trial so far (among those with an objective value; failed ones never count)."""
        return str(self._get_best_training_job()["TrainingJobName"])

    def best_estimator(self, best_training_job: dict[str, Any] | None = None) -> Estimator:
        """An Estimator attached to the best trial: ``model_data`` is its model, ``hyperparameters`` its own."""
        best = best_training_job or self._get_best_training_job()
        store = self._tstore.jobs
        record = store.get(best["TrainingJobName"])
        fields = {**self.estimator.fields, "hyperparameters": dict(record.spec.get("hyperparameters") or {})}
        estimator = Estimator(home=str(store.home), base_job_name=self.estimator.base_job_name, **fields)
        estimator.latest_job = record
        estimator.latest_training_job = TrainingJob(store, record.name)
        return estimator

    def analytics(self) -> HyperparameterTuningJobAnalytics:
        return HyperparameterTuningJobAnalytics(self._ensure_last_tuning_job().name, home=str(self._tstore.jobs.home))
