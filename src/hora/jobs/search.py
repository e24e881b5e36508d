"""How a tuning job picks each trial's hyperparameters (SageMaker's strategies), and when it stops a trial early.

- :class:`RandomSearch`: each value drawn independently, uniformly on its range's scale (``Logarithmic``: uniform
  in log space; ``ReverseLogarithmic``: uniform in ``log(1 - x)``); a seed makes the draws reproducible.
- :class:`GridSearch`: every combination of the categorical values once, in order (``max_jobs`` is their number).
- :class:`BayesianSearch`: Optuna's TPE sampler (the ``tuning`` extra); a range's scaling type picks a log or linear
  distribution; a seed makes the suggestions reproducible (with one trial at a time: in parallel the suggestions
  also depend on the order trials end in).
- Hyperband samples as :class:`RandomSearch` does; its brackets and rungs are :mod:`.hyperband`'s.
- :func:`median_stop`: SageMaker's early stopping ``Auto``, the median stopping rule on the objective's series.

A strategy hands out ``(token, hyperparameters)`` pairs with :meth:`SearchStrategy.suggest` and is told each
trial's outcome with :meth:`SearchStrategy.observe`; a warm start's parents' trials are told first with
:meth:`SearchStrategy.warm`.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from hora.errors import ConfigError
from hora.jobs.parameter import CategoricalParameter, IntegerParameter, ParameterRange

__all__ = [
    "MEDIAN_RULE_MIN_TRIALS",
    "BayesianSearch",
    "GridSearch",
    "RandomSearch",
    "SearchStrategy",
    "grid_size",
    "make_search",
    "median_stop",
    "startup_trials",
]

#: The median rule judges a trial once this many earlier trials have reached the same epoch (SageMaker does not
#: say how many it waits for).
MEDIAN_RULE_MIN_TRIALS = 3
#: Optuna's TPE default for the random trials it starts with.
OPTUNA_STARTUP_TRIALS = 10


class SearchStrategy:
    """Base class: ``suggest()`` the next trial's tuned hyperparameters, ``observe()`` how a trial ended."""

    def __init__(self, ranges: Mapping[str, ParameterRange], maximize: bool, seed: int | None) -> None:
        self.ranges = dict(ranges)
        self.maximize = maximize
        self.seed = seed
        self._count = 0

    def suggest(self) -> tuple[int, dict[str, Any]] | None:
        """(a token for :meth:`observe`, the hyperparameters), or None when the strategy has no more."""
        params = self._next()
        if params is None:
            return None
        self._count += 1
        return self._count - 1, params

    def _next(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def observe(self, token: int, value: float | None, status: str) -> None:
        """Trial ``token`` ended ``status`` (Completed, Failed or Stopped) with final objective ``value``."""

    def warm(self, trials: Sequence[tuple[Mapping[str, Any], float, str]]) -> int:
        """Told before the first suggestion: earlier trials (a warm start's parents'), each as (its
        hyperparameters as strings, its final objective, Completed or Stopped). Returns how many the strategy
        uses (Random, Grid and Hyperband: none; they do not learn from results)."""
        return 0


def _draw(r: ParameterRange, rng: random.Random) -> Any:
    if isinstance(r, CategoricalParameter):
        return rng.choice(r.values)
    lo, hi = float(r.min_value), float(r.max_value)
    if r.scaling_type == "Logarithmic":
        x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    elif r.scaling_type == "ReverseLogarithmic":
        x = 1.0 - math.exp(rng.uniform(math.log(1.0 - hi), math.log(1.0 - lo)))
    elif isinstance(r, IntegerParameter):
        return rng.randint(int(lo), int(hi))
    else:
        x = rng.uniform(lo, hi)
    x = min(max(x, lo), hi)  # rounding at the ends of a log scale
    return min(max(round(x), int(lo)), int(hi)) if isinstance(r, IntegerParameter) else x


class RandomSearch(SearchStrategy):
    def __init__(self, ranges: Mapping[str, ParameterRange], maximize: bool, seed: int | None) -> None:
        super().__init__(ranges, maximize, seed)
        self._rng = random.Random(seed)

    def _next(self) -> dict[str, Any] | None:
        return {name: _draw(r, self._rng) for name, r in self.ranges.items()}


def grid_size(ranges: Mapping[str, ParameterRange]) -> int:
    """The number of combinations of categorical ranges (Grid's ``max_jobs``)."""
    return math.prod(len(r.values) for r in ranges.values() if isinstance(r, CategoricalParameter))


class GridSearch(SearchStrategy):
    def __init__(self, ranges: Mapping[str, ParameterRange], maximize: bool, seed: int | None) -> None:
        super().__init__(ranges, maximize, seed)
        if not all(isinstance(r, CategoricalParameter) for r in ranges.values()):
            raise ConfigError("the Grid strategy takes CategoricalParameter ranges only")
        names = list(ranges)
        self._combos = (dict(zip(names, combo)) for combo in itertools.product(
            *(r.values for r in ranges.values() if isinstance(r, CategoricalParameter))))

    def _next(self) -> dict[str, Any] | None:
        return next(self._combos, None)


def startup_trials(max_jobs: int | None) -> int:
    """How many of a Bayesian tuning job's first trials are random draws before TPE models the results: a third of
    ``max_jobs``, at least 2 and at most Optuna's default of 10 (with that default a tuning job of 10 trials or
    fewer would be a random search)."""
    return OPTUNA_STARTUP_TRIALS if max_jobs is None else max(2, min(OPTUNA_STARTUP_TRIALS, max_jobs // 3))


class BayesianSearch(SearchStrategy):
    """Optuna's TPE sampler through its ask-and-tell interface."""

    def __init__(self, ranges: Mapping[str, ParameterRange], maximize: bool, seed: int | None,
                 max_jobs: int | None = None) -> None:
        super().__init__(ranges, maximize, seed)
        try:
            import optuna
        except ImportError:
            raise ConfigError(
                "the Bayesian strategy needs Optuna: pip install -c constraints.txt -e '.[tuning]' in hora's checkout "
                "(or choose strategy Random or Grid)"
            ) from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        dist = optuna.distributions
        self._dists: dict[str, Any] = {}
        for name, r in ranges.items():
            if isinstance(r, CategoricalParameter):
                self._dists[name] = dist.CategoricalDistribution(r.values)
            elif isinstance(r, IntegerParameter):
                self._dists[name] = dist.IntDistribution(int(r.min_value), int(r.max_value),
                                                         log=r.scaling_type == "Logarithmic")
            elif r.scaling_type == "ReverseLogarithmic":  # sampled as y = 1 - x on a log scale
                self._dists[name] = dist.FloatDistribution(1.0 - float(r.max_value), 1.0 - float(r.min_value), log=True)
            else:
                self._dists[name] = dist.FloatDistribution(float(r.min_value), float(r.max_value),
                                                           log=r.scaling_type == "Logarithmic")
        sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=startup_trials(max_jobs))
        self._study = optuna.create_study(direction="maximize" if maximize else "minimize", sampler=sampler)
        self._trials: dict[int, Any] = {}

    def _next(self) -> dict[str, Any] | None:
        trial = self._study.ask(self._dists)
        self._trials[self._count] = trial
        out = {}
        for name, r in self.ranges.items():
            value = trial.params[name]
            reverse = not isinstance(r, CategoricalParameter) and r.scaling_type == "ReverseLogarithmic"
            out[name] = 1.0 - value if reverse else value
        return out

    def observe(self, token: int, value: float | None, status: str) -> None:
        trial = self._trials.pop(token, None)
        if trial is None:
            return
        state = self._optuna.trial.TrialState
        if value is None or not math.isfinite(value):
            self._study.tell(trial, state=state.FAIL)
        elif status == "Stopped":  # stopped early: worse than the median, its last value is kept as a pruned one
            trial.report(value, 0)
            self._study.tell(trial, state=state.PRUNED)
        else:
            self._study.tell(trial, value)


    def _point(self, hps: Mapping[str, Any]) -> dict[str, Any] | None:
        """A trial's hyperparameters as the study's params, or None when one is missing or out of its range."""
        params: dict[str, Any] = {}
        for name, r in self.ranges.items():
            if name not in hps:
                return None
            raw = hps[name]
            if isinstance(r, CategoricalParameter):
                if str(raw) not in r.values:
                    return None
                params[name] = str(raw)
                continue
            try:
                x = float(raw)
            except (TypeError, ValueError):
                return None
            if not (float(r.min_value) <= x <= float(r.max_value)) or (
                    isinstance(r, IntegerParameter) and not x.is_integer()):
                return None
            dist = self._dists[name]
            if isinstance(r, IntegerParameter):
                params[name] = int(x)
            elif r.scaling_type == "ReverseLogarithmic":
                params[name] = min(max(1.0 - x, dist.low), dist.high)
            else:
                params[name] = x
        return params

    def warm(self, trials: Sequence[tuple[Mapping[str, Any], float, str]]) -> int:
        """Each earlier trial inside this study's ranges is added to it: a Completed one as complete, a Stopped one
        as pruned (as this study's own stopped trials are); one outside the ranges is skipped."""
        told = 0
        state = self._optuna.trial.TrialState
        for hps, value, status in trials:
            params = self._point(hps)
            if params is None or value is None or not math.isfinite(value):
                continue
            if status == "Completed":
                trial = self._optuna.trial.create_trial(params=params, distributions=self._dists, value=value)
            else:
                trial = self._optuna.trial.create_trial(params=params, distributions=self._dists,
                                                        intermediate_values={0: value}, state=state.PRUNED)
            self._study.add_trial(trial)
            told += 1
        return told


STRATEGIES = {"Random": RandomSearch, "Grid": GridSearch, "Bayesian": BayesianSearch, "Hyperband": RandomSearch}


def make_search(strategy: str, ranges: Mapping[str, ParameterRange], maximize: bool,
                seed: int | None, max_jobs: int | None = None) -> SearchStrategy:
    """The strategy's search (Hyperband samples at random; its early stopping is :mod:`.hyperband`'s)."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy {strategy!r}: hora runs Bayesian, Random, Grid and Hyperband")
    if strategy == "Bayesian":
        return BayesianSearch(ranges, maximize, seed, max_jobs)
    return STRATEGIES[strategy](ranges, maximize, seed)


def median_stop(series: Sequence[float], earlier: Sequence[Sequence[float]], maximize: bool,
                min_trials: int = MEDIAN_RULE_MIN_TRIALS) -> str | None:
    """SageMaker's median stopping rule: after epoch ``k`` (the ``k``-th value of the objective), a trial whose
    value is worse than the median of the earlier trials' running averages up to epoch ``k`` is stopped. Returns
    why it should stop, or None (keep going; also while fewer than ``min_trials`` earlier trials reached epoch
    ``k``)."""
    k = len(series)
    if k == 0:
        return None
    averages = [statistics.fmean(s[:k]) for s in earlier if len(s) >= k]
    if len(averages) < min_trials:
        return None
    median = statistics.median(averages)
    value = series[-1]
    if (value < median) if maximize else (value > median):
        return (f"stopped early (median rule): objective {value:g} at epoch {k} is worse than {median:g}, the median "
                f"of {len(averages)} earlier trials' running averages up to that epoch")
    return None
