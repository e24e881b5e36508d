"""The SageMaker SDK's hyperparameter ranges (``sagemaker.parameter``): ``ContinuousParameter``,
``IntegerParameter`` and ``CategoricalParameter``, with the service's rules for them checked before a tuning job
starts (:func:`check_ranges`).

As in the SDK, a categorical range keeps its values as strings (``CategoricalParameter([32, 64]).values`` is
``["32", "64"]``), and ``as_tuning_range(name)`` gives the CreateHyperParameterTuningJob form (numbers as strings).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_HYPERPARAMETERS",
    "MAX_TUNED",
    "SCALING_TYPES",
    "CategoricalParameter",
    "ContinuousParameter",
    "IntegerParameter",
    "ParameterRange",
    "check_ranges",
    "ranges_from_dict",
    "ranges_to_dict",
]

SCALING_TYPES = ("Auto", "Linear", "Logarithmic", "ReverseLogarithmic")
#: ParameterRanges: at most 30 tuned hyperparameters in all (the service's array limit) ...
MAX_TUNED = 30
#: ... and at most 100 hyperparameters, static and tuned together (HyperParameters' map limit).
MAX_HYPERPARAMETERS = 100


def _to_string(value: Any) -> str:
    """The SDK's ``sagemaker.utils.to_string``: ``str`` of the value."""
    return str(value)


class ParameterRange:
    """A range of a tuned hyperparameter: ``min_value`` to ``max_value`` (both included), searched on
    ``scaling_type``'s scale: ``Auto`` (hora: linear), ``Linear``, ``Logarithmic`` (values > 0) or
    ``ReverseLogarithmic`` (continuous, 0 <= values < 1)."""

    __all_types__ = ("Continuous", "Categorical", "Integer")
    __name__ = "Continuous"

    def __init__(self, min_value: float, max_value: float, scaling_type: str = "Auto") -> None:
        self.min_value = min_value
        self.max_value = max_value
        self.scaling_type = scaling_type

    def is_valid(self, value: Any) -> bool:
        return bool(self.min_value <= value <= self.max_value)

    @classmethod
    def cast_to_type(cls, value: Any) -> Any:
        return float(value)

    def as_tuning_range(self, name: str) -> dict[str, Any]:
        return {
            "Name": name,
            "MinValue": _to_string(self.min_value),
            "MaxValue": _to_string(self.max_value),
            "ScalingType": self.scaling_type,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.min_value!r}, {self.max_value!r}, scaling_type={self.scaling_type!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]


class ContinuousParameter(ParameterRange):
    """A real-valued hyperparameter between ``min_value`` and ``max_value``."""

    __name__ = "Continuous"


class IntegerParameter(ParameterRange):
    """An integer hyperparameter between ``min_value`` and ``max_value`` (both included)."""

    __name__ = "Integer"

    @classmethod
    def cast_to_type(cls, value: Any) -> Any:
        return int(value)


class CategoricalParameter(ParameterRange):
    """A hyperparameter taking one of ``values`` (kept as strings, as the SDK does)."""

    __name__ = "Categorical"

    def __init__(self, values: Any) -> None:  # the SDK does not call the base class either
        values = values if isinstance(values, list) else [values]
        self.values = [_to_string(v) for v in values]

    def as_tuning_range(self, name: str) -> dict[str, Any]:
        return {"Name": name, "Values": self.values}

    def as_json_range(self, name: str) -> dict[str, Any]:
        return {"Name": name, "Values": [json.dumps(v) for v in self.values]}

    def is_valid(self, value: Any) -> bool:
        return value in self.values

    @classmethod
    def cast_to_type(cls, value: Any) -> Any:
        return str(value)

    def __repr__(self) -> str:
        return f"CategoricalParameter({self.values!r})"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_ranges(ranges: Any, static: Mapping[str, Any] | None = None) -> list[str]:
    """Every problem of ``ranges`` (name -> range) as a sentence that names the hyperparameter and the fix; empty
    when they are valid. ``static`` are the estimator's other hyperparameters (they count towards the limit of
    100)."""
    if not isinstance(ranges, Mapping) or not ranges:
        return ["hyperparameter_ranges must be a non-empty dict of name -> ContinuousParameter, IntegerParameter "
                "or CategoricalParameter (Need to specify hyperparameter ranges)"]
    problems = []
    if len(ranges) > MAX_TUNED:
        problems.append(f"hyperparameter_ranges has {len(ranges)} hyperparameters; a tuning job tunes at most "
                        f"{MAX_TUNED}: keep the others static in the estimator's hyperparameters")
    total = len(set(ranges) | set(static or {}))
    if total > MAX_HYPERPARAMETERS:
        problems.append(f"{total} hyperparameters, static and tuned: a tuning job takes at most "
                        f"{MAX_HYPERPARAMETERS}; drop some of the estimator's static hyperparameters")
    for name, r in ranges.items():
        where = f"hyperparameter_ranges[{name!r}]"
        if not isinstance(name, str) or not name:
            problems.append(f"hyperparameter name {name!r} must be a non-empty string")
        elif isinstance(r, CategoricalParameter):
            if not r.values:
                problems.append(f"{where}: CategoricalParameter needs at least one value")
            elif len(set(r.values)) != len(r.values):
                problems.append(f"{where}: CategoricalParameter has repeated values {r.values}: list each once")
        elif isinstance(r, (ContinuousParameter, IntegerParameter)):
            problems += _numeric_problems(where, r)
        else:
            problems.append(f"{where} must be a ContinuousParameter, IntegerParameter or CategoricalParameter, "
                            f"got {type(r).__name__}")
    return problems


def _numeric_problems(where: str, r: ParameterRange) -> list[str]:
    kind = type(r).__name__
    lo, hi = r.min_value, r.max_value
    integer = isinstance(r, IntegerParameter)
    if not (_number(lo) and _number(hi)) or (integer and not (float(lo).is_integer() and float(hi).is_integer())):
        want = "integers" if integer else "finite numbers"
        return [f"{where}: {kind} min_value and max_value must be {want}, got {lo!r} and {hi!r}"]
    problems = []
    if lo > hi:
        problems.append(f"{where}: min_value {lo!r} is above max_value {hi!r}: swap them")
    scaling = r.scaling_type
    if scaling not in SCALING_TYPES:
        problems.append(f"{where}: scaling_type {scaling!r} must be one of {', '.join(SCALING_TYPES)}")
    elif scaling == "Logarithmic" and lo <= 0:
        problems.append(f"{where}: Logarithmic scaling works only for ranges above 0, but min_value is {lo!r}: "
                        "raise it or use Linear")
    elif scaling == "ReverseLogarithmic" and integer:
        problems.append(f"{where}: ReverseLogarithmic scaling is for ContinuousParameter only: use Linear or "
                        "Logarithmic")
    elif scaling == "ReverseLogarithmic" and not (lo >= 0 and hi < 1):
        problems.append(f"{where}: ReverseLogarithmic scaling works only for ranges within 0 <= x < 1, got "
                        f"[{lo!r}, {hi!r}]: use Linear or Logarithmic")
    return problems


def ranges_to_dict(ranges: Mapping[str, ParameterRange]) -> dict[str, Any]:
    """ParameterRanges as CreateHyperParameterTuningJob takes them (the tuning job's stored form)."""
    out: dict[str, list[dict[str, Any]]] = {f"{t}ParameterRanges": [] for t in ParameterRange.__all_types__}
    for name, r in ranges.items():
        out[f"{r.__name__}ParameterRanges"].append(r.as_tuning_range(name))
    return out


def ranges_from_dict(data: Mapping[str, Any]) -> dict[str, ParameterRange]:
    """The ranges back from :func:`ranges_to_dict`'s form (keeps the scaling types, unlike the SDK's attach)."""
    ranges: dict[str, ParameterRange] = {}
    for p in data.get("CategoricalParameterRanges", []):
        ranges[p["Name"]] = CategoricalParameter(p["Values"])
    for p in data.get("ContinuousParameterRanges", []):
        ranges[p["Name"]] = ContinuousParameter(float(p["MinValue"]), float(p["MaxValue"]),
                                                p.get("ScalingType", "Auto"))
    for p in data.get("IntegerParameterRanges", []):
        ranges[p["Name"]] = IntegerParameter(int(p["MinValue"]), int(p["MaxValue"]), p.get("ScalingType", "Auto"))
    return ranges
