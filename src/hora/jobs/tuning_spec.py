"""``hora job tune spec.yaml``: a job spec with a ``tuning:`` section beside the training fields.

The training fields are an ordinary job spec (docs/jobs.md; relative paths are relative to the spec's directory);
``tuning:`` takes the SDK ``HyperparameterTuner``'s arguments, the ranges spelled as mappings::

    tuning:
      objective_metric_name: validation:accuracy
      strategy: Random                  # Bayesian (default), Random or Grid
      max_jobs: 6
      max_parallel_jobs: 2
      hyperparameter_ranges:
        lr: {type: Continuous, min_value: 0.0001, max_value: 0.1, scaling_type: Logarithmic}
        layers: {type: Integer, min_value: 1, max_value: 4}
        activation: {type: Categorical, values: [relu, tanh]}
      # optional, as the SDK's classes take them:
      warm_start_config: {type: IdenticalDataAndAlgorithm, parents: [earlier-tuning-job]}
      completion_criteria_config: {target_objective_metric_value: 0.95}
      # strategy: Hyperband with
      # strategy_config: {hyperband_strategy_config: {min_resource: 1, max_resource: 27}}
      ray_address: auto                 # hora's: trials on a Ray cluster (docs/tuning.md)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hora.errors import ConfigError, SpecError
from hora.jobs.checks import type_name, unknown_field
from hora.jobs.estimator import Estimator
from hora.jobs.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter, ParameterRange
from hora.jobs.spec import parse_spec
from hora.jobs.tuner import HyperparameterTuner
from hora.jobs.tuner_configs import (
    HyperbandStrategyConfig,
    StrategyConfig,
    TuningJobCompletionCriteriaConfig,
    WarmStartConfig,
    WarmStartTypes,
)

__all__ = ["TUNING_FIELDS", "load_tuning_spec"]

TUNING_FIELDS = (
    "objective_metric_name", "hyperparameter_ranges", "metric_definitions", "strategy", "objective_type", "max_jobs",
    "max_parallel_jobs", "max_runtime_in_seconds", "base_tuning_job_name", "early_stopping_type", "random_seed",
    "job_name", "warm_start_config", "completion_criteria_config", "strategy_config", "ray_address", "ray_resources",
)
WARM_START_FIELDS = ("type", "parents")
COMPLETION_FIELDS = ("max_number_of_training_jobs_not_improving", "complete_on_convergence",
                     "target_objective_metric_value")
HYPERBAND_FIELDS = ("min_resource", "max_resource")


def _fields(value: Any, where: str, allowed: tuple[str, ...], problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        problems.append(f"{where} must be a mapping of {', '.join(allowed)}, got {type_name(value)}")
        return None
    problems += [unknown_field(str(k), allowed, f" in {where}") for k in value if k not in allowed]
    return {k: v for k, v in value.items() if k in allowed}


def _configs(tuning: dict[str, Any], problems: list[str]) -> None:
    """The SDK config classes from their mappings, in place."""
    if "warm_start_config" in tuning:
        raw = _fields(tuning["warm_start_config"], "tuning.warm_start_config", WARM_START_FIELDS, problems)
        types = [t.value for t in WarmStartTypes]
        if raw is not None and raw.get("type") not in types:
            problems.append(f"tuning.warm_start_config.type {raw.get('type')!r} must be {' or '.join(types)}")
        elif raw is not None and (not isinstance(raw.get("parents"), list) or not raw["parents"]):
            problems.append("tuning.warm_start_config.parents must list the parent tuning jobs' names")
        elif raw is not None:
            tuning["warm_start_config"] = WarmStartConfig(WarmStartTypes(raw["type"]), raw["parents"])
    if "completion_criteria_config" in tuning:
        raw = _fields(tuning["completion_criteria_config"], "tuning.completion_criteria_config", COMPLETION_FIELDS,
                      problems)
        if raw is not None:
            tuning["completion_criteria_config"] = TuningJobCompletionCriteriaConfig(**raw)
    if "strategy_config" in tuning:
        raw = _fields(tuning["strategy_config"], "tuning.strategy_config", ("hyperband_strategy_config",), problems)
        hb = None if raw is None else _fields(raw.get("hyperband_strategy_config", {}),
                                             "tuning.strategy_config.hyperband_strategy_config", HYPERBAND_FIELDS,
                                             problems)
        if hb is not None:
            tuning["strategy_config"] = StrategyConfig(HyperbandStrategyConfig(**hb))
RANGE_FIELDS = {"Continuous": ("type", "min_value", "max_value", "scaling_type"),
                "Integer": ("type", "min_value", "max_value", "scaling_type"),
                "Categorical": ("type", "values")}


def _range(name: str, value: Any, problems: list[str]) -> ParameterRange | None:
    where = f"tuning.hyperparameter_ranges.{name}"
    if not isinstance(value, Mapping):
        problems.append(f"{where} must be a mapping with type (Continuous, Integer or Categorical) and its bounds or "
                        f"values, got {type_name(value)}")
        return None
    kind = value.get("type")
    if kind not in RANGE_FIELDS:
        problems.append(f"{where}: type {kind!r} must be Continuous, Integer or Categorical")
        return None
    for key in value:
        if key not in RANGE_FIELDS[kind]:
            problems.append(unknown_field(str(key), RANGE_FIELDS[kind], f" in {where}"))
    if kind == "Categorical":
        if not isinstance(value.get("values"), list):
            problems.append(f"{where}: a Categorical range needs values: a list of the values to try")
            return None
        return CategoricalParameter(value["values"])
    missing = [k for k in ("min_value", "max_value") if k not in value]
    if missing:
        problems.append(f"{where}: a {kind} range needs {' and '.join(missing)}")
        return None
    cls = ContinuousParameter if kind == "Continuous" else IntegerParameter
    return cls(value["min_value"], value["max_value"], value.get("scaling_type", "Auto"))


def _absolute_fields(training: dict[str, Any], base: Path, source: str) -> dict[str, Any]:
    """The training fields with every local path made absolute (checked as ``hora job run`` checks them)."""
    spec = parse_spec({**training, "job_name": "tuning-spec-check"}, base_dir=base, source=source, confine=True)
    fields = {k: v for k, v in training.items() if k != "job_name"}
    fields["source_dir"], fields["entry_point"] = spec.source_dir, spec.entry_point
    if spec.inputs:
        fields["inputs"] = {c.name: {k: v for k, v in vars(c).items() if k != "name" and v is not None}
                            for c in spec.inputs}
    for key in ("output_path", "checkpoint_path"):
        if getattr(spec, key):
            fields[key] = getattr(spec, key)
    return fields


def load_tuning_spec(path: str, home: str | Path | None = None,
                     ray_address: str | None = None) -> tuple[HyperparameterTuner, str | None]:
    """The tuner a spec file describes (its trials' jobs in ``home``; its trials on the Ray cluster at
    ``ray_address`` when given, whatever the spec says), and the tuning job name it asks for."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            "reading a YAML job spec needs PyYAML: pip install -c constraints.txt -e '.[tuning]' in hora's checkout"
        ) from None
    p = Path(path)
    source = f"job spec {str(p)!r}"
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the job spec {str(p)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError([f"not valid YAML: {exc}"], source) from None
    if not isinstance(data, dict) or not isinstance(data.get("tuning"), dict):
        raise SpecError(["hora job tune needs a `tuning:` section (a mapping) beside the training fields: "
                         "objective_metric_name, hyperparameter_ranges, strategy, max_jobs, ... (docs/tuning.md)"],
                        source)
    tuning = dict(data.pop("tuning"))
    if ray_address is not None:
        tuning["ray_address"] = ray_address
    problems = [unknown_field(str(k), TUNING_FIELDS, " in tuning") for k in tuning if k not in TUNING_FIELDS]
    raw = tuning.pop("hyperparameter_ranges", None)
    ranges: dict[str, ParameterRange] = {}
    if not isinstance(raw, Mapping) or not raw:
        problems.append("tuning.hyperparameter_ranges must map each tuned hyperparameter to its range, e.g. "
                        "lr: {type: Continuous, min_value: 0.001, max_value: 0.1}")
    else:
        for name, value in raw.items():
            r = _range(str(name), value, problems)
            if r is not None:
                ranges[str(name)] = r
    if tuning.get("early_stopping_type") is False:  # YAML 1.1 reads a bare Off as false
        tuning["early_stopping_type"] = "Off"
    _configs(tuning, problems)
    if problems:
        raise SpecError(problems, source)
    fields = _absolute_fields(data, p.resolve().parent, source)
    job_name = tuning.pop("job_name", None)
    known = {k: v for k, v in tuning.items() if k in TUNING_FIELDS}
    estimator = Estimator(home=None if home is None else str(home), **fields)
    try:
        tuner = HyperparameterTuner(estimator, known.pop("objective_metric_name", None), ranges, **known)
    except SpecError as exc:
        raise SpecError([f"tuning: {problem}" for problem in exc.problems], source) from None
    return tuner, job_name
