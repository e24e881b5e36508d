"""Hyperparameter tuning's pure parts: the SDK's ranges and their rules, the tuner's validation, the strategies'
counts and values, Bayesian (Optuna's TPE) reproducible and better than Random, the median stopping rule."""

from __future__ import annotations

import importlib.util
import math
import statistics

import pytest

from hora.errors import ConfigError, SpecError
from hora.jobs import (
    CategoricalParameter,
    ContinuousParameter,
    Estimator,
    HyperparameterTuner,
    IntegerParameter,
    WarmStartConfig,
    WarmStartTypes,
)
from hora.jobs.parameter import check_ranges, ranges_from_dict, ranges_to_dict
from hora.jobs.search import (
    BayesianSearch,
    GridSearch,
    RandomSearch,
    grid_size,
    make_search,
    median_stop,
    startup_trials,
)

METRICS = [{"Name": "acc", "Regex": "acc=([0-9.]+)"}]


@pytest.fixture
def estimator(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('acc=1')\n")
    monkeypatch.chdir(tmp_path)
    return Estimator(entry_point="train.py", home=str(tmp_path / "home"), hyperparameters={"epochs": 2, "lr": 1},
                     metric_definitions=METRICS)


def test_ranges_keep_the_sdk_forms():
    assert CategoricalParameter([32, 64]).values == ["32", "64"]
    assert CategoricalParameter("a").values == ["a"]
    ranges = {"lr": ContinuousParameter(1e-4, 0.1, "Logarithmic"), "layers": IntegerParameter(1, 4),
              "act": CategoricalParameter(["relu", "tanh"])}
    wire = ranges_to_dict(ranges)
    assert wire == {
        "ContinuousParameterRanges": [{"Name": "lr", "MinValue": "0.0001", "MaxValue": "0.1",
                                       "ScalingType": "Logarithmic"}],
        "CategoricalParameterRanges": [{"Name": "act", "Values": ["relu", "tanh"]}],
        "IntegerParameterRanges": [{"Name": "layers", "MinValue": "1", "MaxValue": "4", "ScalingType": "Auto"}],
    }
    assert ranges_from_dict(wire) == ranges
    assert CategoricalParameter(["a"]).as_json_range("x") == {"Name": "x", "Values": ['"a"']}
    assert IntegerParameter.cast_to_type("3") == 3 and ContinuousParameter(0, 1).is_valid(0.5)


@pytest.mark.parametrize("ranges, needle", [
    ({"lr": ContinuousParameter(0, 1, "Logarithmic")}, "Logarithmic scaling works only for ranges above 0"),
    ({"lr": ContinuousParameter(0.5, 1.0, "ReverseLogarithmic")}, "within 0 <= x < 1"),
    ({"n": IntegerParameter(1, 5, "ReverseLogarithmic")}, "ReverseLogarithmic scaling is for ContinuousParameter"),
    ({"lr": ContinuousParameter(1, 0)}, "min_value 1 is above max_value 0"),
    ({"lr": ContinuousParameter(0, 1, "Cubic")}, "scaling_type 'Cubic' must be one of Auto, Linear"),
    ({"n": IntegerParameter(1.5, 3)}, "must be integers"),
    ({"c": CategoricalParameter([])}, "needs at least one value"),
    ({"c": CategoricalParameter(["a", "a"])}, "repeated values"),
    ({"x": (0, 1)}, "must be a ContinuousParameter, IntegerParameter or CategoricalParameter, got tuple"),
    ({f"h{i}": IntegerParameter(0, 1) for i in range(31)}, "tunes at most 30"),
])
def test_bad_ranges_are_named_with_the_fix(ranges, needle):
    problems = check_ranges(ranges)
    assert len(problems) == 1 and needle in problems[0], problems


def test_at_most_100_hyperparameters_static_and_tuned():
    static = {f"s{i}": i for i in range(99)}
    assert check_ranges({"a": IntegerParameter(0, 1)}, static) == []
    assert "102 hyperparameters" in check_ranges({"a": IntegerParameter(0, 1), "b": IntegerParameter(0, 1)},
                                                  {**static, "x": 1})[0]


def test_tuner_defaults_and_validation(estimator):
    tuner = HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0.01, 1)})
    assert (tuner.strategy, tuner.objective_type, tuner.max_jobs, tuner.max_parallel_jobs,
            tuner.early_stopping_type) == ("Bayesian", "Maximize", 1, 1, "Off")
    assert tuner.static_hyperparameters() == {"epochs": 2}  # the tuned lr is not static
    grid = HyperparameterTuner(estimator, "acc", {"a": CategoricalParameter([1, 2, 3]),
                                                  "b": CategoricalParameter(["x", "y"])}, strategy="Grid")
    assert grid.max_jobs is None
    assert grid.tuning_config("g")["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxNumberOfTrainingJobs"] == 6
    with pytest.raises(ConfigError, match=r"^Need to specify hyperparameter ranges or set autotune=True\.$"):
        HyperparameterTuner(estimator, "acc", {})
    with pytest.raises(SpecError) as err:
        HyperparameterTuner(estimator, "loss", {"lr": ContinuousParameter(0, 1)}, strategy="Annealing",
                            objective_type="Max", max_jobs=0, max_parallel_jobs=0, early_stopping_type="On",
                            random_seed=-1)
    text = str(err.value)
    for needle in ("strategy 'Annealing' must be one of Bayesian, Random, Hyperband, Grid",
                   "objective_type 'Max' must be 'Maximize' or 'Minimize'",
                   "objective_metric_name 'loss' is not among the metric_definitions' names ('acc')",
                   "max_jobs must be a whole number >= 1, got 0", "max_parallel_jobs must be a whole number >= 1",
                   "early_stopping_type 'On' must be 'Off' or 'Auto'", "random_seed must be a whole number >= 0"):
        assert needle in text, text
    with pytest.raises(SpecError, match=r"Grid strategy runs every combination.*leave max_jobs out"):
        HyperparameterTuner(estimator, "acc", {"a": CategoricalParameter([1])}, strategy="Grid", max_jobs=3)
    with pytest.raises(SpecError, match="Grid strategy takes CategoricalParameter ranges only; lr must be"):
        HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0, 1)}, strategy="Grid")
    with pytest.raises(SpecError) as err:
        HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0, 1)}, strategy="Hyperband",
                            early_stopping_type="Auto")
    assert "early_stopping_type must be 'Off' with the Hyperband strategy" in str(err.value)
    with pytest.raises(ConfigError, match="autotune: not supported by hora's tuner yet"):
        HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0, 1)}, autotune=True)
    with pytest.raises(ConfigError, match="parents should not be None/empty"):
        WarmStartConfig(WarmStartTypes.TRANSFER_LEARNING, set())
    # the tuner's own metric definitions replace the estimator's
    HyperparameterTuner(estimator, "loss", {"lr": ContinuousParameter(0, 1)},
                        metric_definitions=[{"Name": "loss", "Regex": "loss=(.*)"}])
    with pytest.raises(ConfigError, match="a tuning job's name is 1-32 letters"):
        tuner.fit(job_name="x" * 33, wait=False)
    with pytest.raises(ConfigError, match=r"^No tuning job available$"):
        tuner.best_training_job()


def test_random_draws_stay_in_range_on_their_scale_and_repeat_with_a_seed():
    ranges = {"lin": ContinuousParameter(-1, 1), "log": ContinuousParameter(1e-6, 1, "Logarithmic"),
              "rev": ContinuousParameter(0, 0.999999, "ReverseLogarithmic"), "n": IntegerParameter(1, 3),
              "nlog": IntegerParameter(1, 1000, "Logarithmic"), "c": CategoricalParameter(["a", "b"])}
    search = RandomSearch(ranges, True, seed=7)
    draws = [search.suggest()[1] for _ in range(2000)]  # type: ignore[index]
    again = RandomSearch(ranges, True, seed=7)
    assert draws[:20] == [again.suggest()[1] for _ in range(20)]  # type: ignore[index]
    assert draws[:20] != [RandomSearch(ranges, True, seed=8).suggest()[1] for _ in range(20)]  # type: ignore[index]
    for d in draws:
        assert -1 <= d["lin"] <= 1 and 1e-6 <= d["log"] <= 1 and 0 <= d["rev"] <= 0.999999
        assert d["n"] in (1, 2, 3) and isinstance(d["nlog"], int) and 1 <= d["nlog"] <= 1000
        assert d["c"] in ("a", "b")
    assert {d["n"] for d in draws} == {1, 2, 3}
    # Logarithmic: each decade equally likely (median near 1e-3); ReverseLogarithmic: crowds near 1
    assert 1e-4 < statistics.median(d["log"] for d in draws) < 1e-2
    assert statistics.median(d["rev"] for d in draws) > 0.99
    assert statistics.median(d["lin"] for d in draws) == pytest.approx(0, abs=0.1)


def test_grid_runs_every_combination_once_in_order():
    ranges = {"a": CategoricalParameter([1, 2, 3]), "b": CategoricalParameter(["x", "y"])}
    assert grid_size(ranges) == 6
    search = GridSearch(ranges, True, None)
    got = []
    while (s := search.suggest()) is not None:
        got.append(s[1])
    assert got == [{"a": a, "b": b} for a in ("1", "2", "3") for b in ("x", "y")]
    with pytest.raises(ConfigError, match="Grid strategy takes CategoricalParameter ranges only"):
        GridSearch({"x": ContinuousParameter(0, 1)}, True, None)


def _objective(p: dict) -> float:
    """Known optimum 0 at x = 1.3, lr = 10**-3.2."""
    return -((p["x"] - 1.3) ** 2) - (math.log10(p["lr"]) + 3.2) ** 2 - (0.0 if p["act"] == "tanh" else 0.5)


RANGES = {"x": ContinuousParameter(-5, 5), "lr": ContinuousParameter(1e-6, 1, "Logarithmic"),
          "act": CategoricalParameter(["relu", "tanh", "sigmoid"])}


def _best(strategy: str, seed: int, trials: int = 40) -> tuple[float, list[dict]]:
    search = make_search(strategy, RANGES, True, seed)
    best, seen = -math.inf, []
    for _ in range(trials):
        token, params = search.suggest()  # type: ignore[misc]
        value = _objective(params)
        seen.append(params)
        search.observe(token, value, "Completed")
        best = max(best, value)
    return best, seen


def test_bayesian_is_reproducible_with_a_seed_and_beats_random_on_a_known_optimum():
    assert _best("Bayesian", 3, 15)[1] == _best("Bayesian", 3, 15)[1]
    assert _best("Bayesian", 3, 15)[1] != _best("Bayesian", 4, 15)[1]
    seeds = range(5)
    bayes = statistics.fmean(_best("Bayesian", s)[0] for s in seeds)
    rand = statistics.fmean(_best("Random", s)[0] for s in seeds)
    assert bayes > rand, (bayes, rand)
    assert bayes > -0.2  # close to the optimum 0


def test_bayesian_takes_failed_and_stopped_trials_and_maps_reverse_log():
    search = BayesianSearch({"m": ContinuousParameter(0.9, 0.9999, "ReverseLogarithmic"),
                             "n": IntegerParameter(1, 100, "Logarithmic")}, False, 0)
    for i in range(12):
        token, p = search.suggest()  # type: ignore[misc]
        assert 0.9 <= p["m"] <= 0.9999 and isinstance(p["n"], int) and 1 <= p["n"] <= 100
        search.observe(token, None if i % 3 == 0 else p["m"], "Failed" if i % 3 == 0 else
                       "Stopped" if i % 3 == 1 else "Completed")
    states = [t.state.name for t in search._study.trials]
    assert states.count("FAIL") == 4 and states.count("PRUNED") == 4 and states.count("COMPLETE") == 4


def test_the_median_rule_stops_a_trial_worse_than_the_median_of_running_averages():
    earlier = [[0.5, 0.6, 0.7], [0.4, 0.5, 0.6], [0.3, 0.4, 0.5], [0.1]]
    # epoch 2: running averages 0.55, 0.45, 0.35 -> median 0.45
    assert median_stop([0.2, 0.46], earlier, maximize=True) is None
    why = median_stop([0.2, 0.44], earlier, maximize=True)
    assert why is not None and "objective 0.44 at epoch 2 is worse than 0.45" in why and "3 earlier" in why
    # minimizing: worse is higher
    assert median_stop([0.2, 0.44], earlier, maximize=False) is None
    assert median_stop([0.2, 0.46], earlier, maximize=False) is not None
    # not judged before 3 earlier trials reached the epoch
    assert median_stop([0.0, 0.0, 0.0, 0.0], earlier, maximize=True) is None
    assert median_stop([0.0, 0.0], earlier[:2], maximize=True) is None
    assert median_stop([], earlier, maximize=True) is None
    # epoch 1, four trials: median of 0.5, 0.4, 0.3, 0.1 is 0.35
    assert median_stop([0.34], earlier, maximize=True) is not None
    assert median_stop([0.36], earlier, maximize=True) is None


def test_a_small_bayesian_tuning_job_starts_modelling_before_optunas_ten_random_trials():
    assert [startup_trials(n) for n in (None, 1, 6, 12, 30, 100)] == [10, 2, 2, 4, 10, 10]
    search = make_search("Bayesian", RANGES, True, 0, max_jobs=6)
    assert search._study.sampler._n_startup_trials == 2  # type: ignore[attr-defined]


def test_ray_settings_reach_the_tuning_config_from_python_a_spec_and_the_command_line(estimator, tmp_path):
    pytest.importorskip("yaml")
    if importlib.util.find_spec("ray") is None:  # not imported: importing Ray sets environment variables
        pytest.skip("needs the ray extra")
    from hora.jobs.tuning_spec import load_tuning_spec

    tuner = HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0, 1)}, ray_address="auto",
                                ray_resources={"CPU": 2})
    assert tuner.tuning_config("t")["ray"] == {"address": "auto", "resources": {"CPU": 2}}
    assert HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0, 1)}).tuning_config("t")["ray"] is None
    spec = tmp_path / "tune.yaml"
    spec.write_text("entry_point: train.py\nmetric_definitions: [{Name: acc, Regex: 'acc=([0-9.]+)'}]\n"
                    "tuning:\n  objective_metric_name: acc\n  ray_address: head:6379\n  ray_resources: {GPU: 1}\n"
                    "  hyperparameter_ranges:\n    lr: {type: Continuous, min_value: 0.1, max_value: 1}\n")
    from_spec, _ = load_tuning_spec(str(spec), tmp_path / "home")
    assert (from_spec.ray_address, from_spec.ray_resources) == ("head:6379", {"GPU": 1})
    from_cli, _ = load_tuning_spec(str(spec), tmp_path / "home", ray_address="auto")
    assert from_cli.ray_address == "auto"
    with pytest.raises(SpecError, match="tuning: ray_resources must map Ray resource names"):
        spec.write_text(spec.read_text().replace("{GPU: 1}", "{GPU: lots}"))
        load_tuning_spec(str(spec), tmp_path / "home")
