"""SageMaker's Hyperband strategy, run by hora as asynchronous successive halving in Hyperband brackets (Li et al.,
"A System for Massively Parallel Hyperparameter Tuning"; Optuna's ``HyperbandPruner`` works the same way).

- The resource is the epoch: the k-th value of a trial's objective series is its value after epoch k.
- Brackets: with reduction factor ``eta`` = 3 there are ``floor(log_eta(max_resource / min_resource)) + 1`` of them;
  the n-th trial of the tuning job (from 0) is in bracket ``n % brackets`` (round robin).
- Rungs: bracket ``b`` judges its trials at epochs ``min_resource * eta**(b + k)`` (k = 0, 1, ...) below
  ``max_resource``: bracket 0 is the most aggressive, the last bracket never stops a trial.
- At a rung, a trial goes on only if its value there is among the best ``max(1, n // eta)`` values of the ``n``
  trials of its bracket that reached that rung so far (itself included; ties go on). The first trials to reach a
  rung therefore go on while they are the best so far, as in Optuna's asynchronous successive halving.

Hyperband samples the hyperparameters at random (seeded by ``random_seed``); :func:`hyperband_problems` checks a
tuning job's Hyperband settings as the service does and resolves its resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EPOCH_KEYS", "ETA", "MAX_RESOURCE_LIMIT", "Hyperband", "hyperband_problems"]

ETA = 3
#: The static hyperparameters SageMaker reads MaxResource from when it is not given, in this order.
EPOCH_KEYS = ("epochs", "numepochs", "n-epochs", "n_epochs", "num_epochs")
MAX_RESOURCE_LIMIT = 20000


@dataclass(frozen=True)
class Hyperband:
    """The brackets and rungs of a Hyperband tuning job, and its decisions."""

    min_resource: int
    max_resource: int
    eta: int = ETA

    @property
    def brackets(self) -> int:
        """``floor(log_eta(max_resource / min_resource)) + 1``, computed in integers."""
        s = 0
        while self.min_resource * self.eta ** (s + 1) <= self.max_resource:
            s += 1
        return s + 1

    def bracket(self, index: int) -> int:
        """The bracket of the tuning job's ``index``-th trial (from 0)."""
        return index % self.brackets

    def rungs(self, bracket: int) -> list[int]:
        """The epochs at which bracket ``bracket`` judges its trials."""
        out = []
        r = self.min_resource * self.eta ** bracket
        while r < self.max_resource:
            out.append(r)
            r *= self.eta
        return out

    def judge(self, bracket: int, series: Sequence[float], peers: Sequence[Sequence[float]],
              maximize: bool) -> str | None:
        """Why a trial of ``bracket`` whose objective series is ``series`` stops at its last epoch, or None (it
        goes on: that epoch is no rung, or it is among the best there). ``peers`` are the series of the other
        trials of the same bracket."""
        k = len(series)
        if k > self.max_resource:
            return (f"stopped (Hyperband): the trial reported epoch {k}, past MaxResource ({self.max_resource} "
                    "epochs)")
        if k == 0 or k not in self.rungs(bracket):
            return None
        value = series[k - 1]
        values = [p[k - 1] for p in peers if len(p) >= k] + [value]
        keep = max(1, len(values) // self.eta)
        ranked = sorted(values, reverse=maximize)
        bar = ranked[keep - 1]
        if (value < bar) if maximize else (value > bar):
            return (f"stopped early (Hyperband): objective {value:g} at epoch {k} (a rung of bracket {bracket}) is "
                    f"not among the best {keep} of the {len(values)} trials of the bracket that reached it "
                    f"(the {keep}{_suffix(keep)} best is {bar:g})")
        return None


def _suffix(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _whole(value: Any) -> int | None:
    """An int from an int or a string of one (static hyperparameters may be either), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def hyperband_problems(strategy: str, strategy_config: Any, static: Mapping[str, Any],
                       tuned: Sequence[str]) -> tuple[list[str], dict[str, Any] | None]:
    """The problems of a tuning job's Hyperband settings (CreateHyperParameterTuningJob's rules) and, for a valid
    Hyperband tuning job, its resolved resources ``{"min_resource", "max_resource", "epochs_key"}``
    (``epochs_key``: the static hyperparameter that gives each trial ``max_resource``, or None)."""
    from hora.jobs.tuner_configs import HyperbandStrategyConfig, StrategyConfig

    problems: list[str] = []
    if strategy != "Hyperband":
        if strategy_config is not None:
            problems.append(f"strategy_config (HyperbandStrategyConfig) is only for the Hyperband strategy, not "
                            f"{strategy!r}: leave it out or use strategy='Hyperband'")
        return problems, None
    config = None
    if strategy_config is not None:
        if not isinstance(strategy_config, StrategyConfig) or not isinstance(
                strategy_config.hyperband_strategy_config, HyperbandStrategyConfig):
            problems.append("strategy_config must be StrategyConfig(hyperband_strategy_config="
                            "HyperbandStrategyConfig(max_resource=..., min_resource=...))")
            return problems, None
        config = strategy_config.hyperband_strategy_config
    min_resource = None if config is None else config.min_resource
    max_resource = None if config is None else config.max_resource
    epochs_key = next((k for k in EPOCH_KEYS if k in static), None)
    for name, value in (("min_resource", min_resource), ("max_resource", max_resource)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append(f"HyperbandStrategyConfig {name} must be a whole number >= 1, got {value!r}")
    if max_resource is None:
        if epochs_key is None:
            problems.append("the Hyperband strategy needs MaxResource: set HyperbandStrategyConfig(max_resource=N) "
                            f"or give the estimator a static hyperparameter named {', '.join(EPOCH_KEYS[:-1])} or "
                            f"{EPOCH_KEYS[-1]} (the number of epochs each trial may run)")
        else:
            max_resource = _whole(static[epochs_key])
            if max_resource is None or max_resource < 1:
                problems.append(f"the Hyperband strategy reads MaxResource from the static hyperparameter "
                                f"{epochs_key}={static[epochs_key]!r}, which must be a whole number >= 1; fix it or "
                                "set HyperbandStrategyConfig(max_resource=N)")
    if isinstance(max_resource, int) and max_resource > MAX_RESOURCE_LIMIT:
        problems.append(f"HyperbandStrategyConfig max_resource {max_resource} is above {MAX_RESOURCE_LIMIT} "
                        "(SageMaker's maximum number of epochs)")
    min_resource = 1 if min_resource is None else min_resource
    if not problems and isinstance(max_resource, int) and min_resource > max_resource:
        problems.append(f"HyperbandStrategyConfig min_resource {min_resource} is above max_resource "
                        f"{max_resource}: lower it (a trial runs at most max_resource epochs)")
    clash = sorted(set(tuned) & set(EPOCH_KEYS))
    if clash:
        problems.append(f"hyperparameter_ranges[{clash[0]!r}]: the Hyperband strategy gives every trial "
                        "max_resource epochs itself; keep the number of epochs static")
    if problems:
        return problems, None
    return [], {"min_resource": min_resource, "max_resource": max_resource, "epochs_key": epochs_key}
