"""Hyperband's brackets, rungs and decisions on scripted series; completion criteria decisions; warm start's checks
and what a Bayesian study takes from its parents; the SDK config classes' request forms; their spec keys."""

from __future__ import annotations

import math
import statistics
import textwrap
import time

import pytest

from hora.errors import SpecError
from hora.jobs import (
    CategoricalParameter,
    ContinuousParameter,
    Estimator,
    HyperbandStrategyConfig,
    HyperparameterTuner,
    IntegerParameter,
    StrategyConfig,
    TuningJobCompletionCriteriaConfig,
    WarmStartConfig,
    WarmStartTypes,
)
from hora.jobs.completion import CompletionCriteria, completion_problems, converged, improves, not_improving
from hora.jobs.hyperband import Hyperband, hyperband_problems
from hora.jobs.search import BayesianSearch, make_search
from hora.jobs.tuning_store import TuningStore
from hora.jobs.warm_start import parent_problems, parent_trials, warm_start_problems

METRICS = [{"Name": "acc", "Regex": "acc=([0-9.]+)"}]


@pytest.fixture
def estimator(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('acc=1')\n")
    monkeypatch.chdir(tmp_path)
    return Estimator(entry_point="train.py", home=str(tmp_path / "home"), hyperparameters={"epochs": 9, "lr": 1},
                     metric_definitions=METRICS)


# --- Hyperband -----------------------------------------------------------------------------------------------------

def test_hyperband_brackets_and_rungs():
    hb = Hyperband(1, 27)
    assert hb.brackets == 4  # floor(log3(27)) + 1
    assert [hb.rungs(b) for b in range(4)] == [[1, 3, 9], [3, 9], [9], []]
    assert [hb.bracket(i) for i in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert Hyperband(1, 26).brackets == 3 and Hyperband(1, 26).rungs(0) == [1, 3, 9]
    assert Hyperband(2, 9).brackets == 2 and [Hyperband(2, 9).rungs(b) for b in (0, 1)] == [[2, 6], [6]]
    assert Hyperband(5, 5).brackets == 1 and Hyperband(5, 5).rungs(0) == []
    assert Hyperband(1, 100).brackets == 5  # 81 <= 100 < 243


def test_hyperband_keeps_the_best_third_at_a_rung_and_the_best_so_far_when_few_reached_it():
    hb = Hyperband(1, 9)
    # the first trial at a rung goes on; with fewer than 3 there, only the best so far goes on
    assert hb.judge(0, [0.1], [], maximize=True) is None
    assert hb.judge(0, [0.5], [[0.6, 0.7]], maximize=True) is not None
    assert hb.judge(0, [0.6], [[0.6, 0.7]], maximize=True) is None  # a tie goes on
    # 6 trials reached epoch 1: the best 2 go on
    peers = [[0.9], [0.8], [0.2], [0.3], [0.4]]
    assert hb.judge(0, [0.85], peers, maximize=True) is None
    why = hb.judge(0, [0.7], peers, maximize=True)
    assert why == ("stopped early (Hyperband): objective 0.7 at epoch 1 (a rung of bracket 0) is not among the best 2 "
                   "of the 6 trials of the bracket that reached it (the 2nd best is 0.8)")
    # minimizing: lower is better
    assert hb.judge(0, [0.25], peers, maximize=False) is None
    assert hb.judge(0, [0.35], peers, maximize=False) is not None
    # epoch 2 is no rung of bracket 0; epoch 3 is, judged among those that reached it
    assert hb.judge(0, [0.0, 0.0], peers, maximize=True) is None
    assert hb.judge(0, [0.9, 0.9, 0.5], [[0.9, 0.9, 0.6], [0.1]], maximize=True) is not None
    assert hb.judge(0, [0.9, 0.9, 0.7], [[0.9, 0.9, 0.6], [0.1]], maximize=True) is None
    # bracket 2 (of 3) never stops a trial before MaxResource; past it, it does
    assert all(hb.judge(2, [0.0] * k, [[1.0] * 9], maximize=True) is None for k in range(1, 10))
    assert "past MaxResource (9 epochs)" in (hb.judge(2, [0.0] * 10, [], maximize=True) or "")


def _run_sequentially(hb: Hyperband, curves: list[list[float]]) -> list[int]:
    """Each trial in turn (one at a time), judged at every epoch as the supervisor judges it: how many epochs
    each ran."""
    ran: list[list[float]] = []
    brackets: list[int] = []
    for i, curve in enumerate(curves):
        bracket = hb.bracket(i)
        peers = [s for s, b in zip(ran, brackets) if b == bracket]
        series: list[float] = []
        for value in curve:
            series.append(value)
            if hb.judge(bracket, series, peers, maximize=True) is not None:
                break
        ran.append(series)
        brackets.append(bracket)
    return [len(s) for s in ran]


def test_asynchronous_successive_halving_on_scripted_curves():
    hb = Hyperband(1, 9)  # brackets 0 (rungs 1, 3), 1 (rung 3), 2 (none)
    level = [0.5, 0.9, 0.1, 0.6, 0.3, 0.2, 0.8, 0.95, 0.4, 0.05]
    curves = [[lv + e / 100 for e in range(9)] for lv in level]
    # bracket 0 holds trials 0, 3, 6, 9; 1 holds 1, 4, 7; 2 holds 2, 5, 8
    assert _run_sequentially(hb, curves) == [
        9,  # 0: first at each rung of bracket 0
        9,  # 1: first at bracket 1's rung
        9,  # 2: bracket 2 never stops
        9,  # 3: 0.6 beats 0.5 at epochs 1 and 3
        3,  # 4: 0.3 at epoch 3 is not the best of bracket 1 (0.9 is)
        9,  # 5: bracket 2
        9,  # 6: 0.8 is the best of bracket 0 so far
        9,  # 7: 0.95 is the best of bracket 1
        9,  # 8: bracket 2
        1,  # 9: 0.05 at epoch 1: 4 trials reached it, only the best goes on
    ]


def test_hyperband_settings_are_checked_and_resolved_as_the_service_does(estimator):
    def check(static, config=None, tuned=(), strategy="Hyperband"):
        return hyperband_problems(strategy, config, static, list(tuned))

    assert check({"epochs": 9}) == ([], {"min_resource": 1, "max_resource": 9, "epochs_key": "epochs"})
    assert check({"n_epochs": "12"})[1] == {"min_resource": 1, "max_resource": 12, "epochs_key": "n_epochs"}
    cfg = StrategyConfig(HyperbandStrategyConfig(max_resource=27, min_resource=3))
    assert check({}, cfg) == ([], {"min_resource": 3, "max_resource": 27, "epochs_key": None})
    problems = check({"lr": 1})[0]
    assert problems == ["the Hyperband strategy needs MaxResource: set HyperbandStrategyConfig(max_resource=N) or give "
                        "the estimator a static hyperparameter named epochs, numepochs, n-epochs, n_epochs or "
                        "num_epochs (the number of epochs each trial may run)"]
    assert "must be a whole number >= 1" in check({"epochs": "many"})[0][0]
    assert "above 20000" in check({}, StrategyConfig(HyperbandStrategyConfig(20001, 1)))[0][0]
    assert "min_resource 10 is above max_resource 9" in check({"epochs": 9},
                                                              StrategyConfig(HyperbandStrategyConfig(None, 10)))[0][0]
    assert "min_resource must be a whole number >= 1, got 0" in check(
        {}, StrategyConfig(HyperbandStrategyConfig(9, 0)))[0][0]
    assert "keep the number of epochs static" in check({}, cfg, tuned=["epochs"])[0][0]
    assert "only for the Hyperband strategy, not 'Random'" in check({}, cfg, strategy="Random")[0][0]
    # through the tuner: its request and the trials' epochs (max_resource replaces the static epochs)
    tuner = HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0.1, 1)}, strategy="Hyperband",
                                strategy_config=StrategyConfig(HyperbandStrategyConfig(max_resource=5,
                                                                                       min_resource=1)),
                                max_jobs=4)
    config = tuner.tuning_config("hb")
    assert config["HyperParameterTuningJobConfig"]["StrategyConfig"] == {
        "HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 5}}
    assert config["TrainingJobDefinition"]["StaticHyperParameters"] == {"epochs": "5"}
    assert config["hyperband"] == {"min_resource": 1, "max_resource": 5, "epochs_key": "epochs"}
    with pytest.raises(SpecError, match=r"strategy_config \(HyperbandStrategyConfig\) is only for the Hyperband"):
        HyperparameterTuner(estimator, "acc", {"lr": ContinuousParameter(0.1, 1)}, strategy="Bayesian",
                            strategy_config=StrategyConfig(HyperbandStrategyConfig(5, 1)))
    assert type(make_search("Hyperband", {"lr": ContinuousParameter(0.1, 1)}, True, 3)).__name__ == "RandomSearch"


# --- completion criteria -------------------------------------------------------------------------------------------

def test_improvement_and_not_improving_counts():
    assert improves(1.0, None, True) and improves(1.011, 1.0, True) and not improves(1.01, 1.0, True)
    assert improves(-1.0, 0.0, True) is False and improves(0.5, 0.0, True)
    assert improves(0.98, 1.0, False) and not improves(0.995, 1.0, False)
    assert not_improving([], True) == 0
    assert not_improving([0.5, 0.6, 0.55, 0.601, 0.59], True) == 3  # 0.601 is better, by less than 1%
    assert not_improving([0.5, 0.6, 0.55, 0.7], True) == 0
    assert not_improving([0.5, 0.4, 0.45, 0.3], False) == 0
    assert not_improving([0.5, 0.4, 0.45, 0.41], False) == 2


def test_convergence_is_horas_rule():
    flat = [0.5, 0.8, 0.9, 0.7, 0.6, 0.9, 0.905, 0.3, 0.85, 0.9]
    assert converged(flat, True)  # 0.905 is not 1% better than 0.9, the best of the first five
    assert not converged(flat[:9], True)  # fewer than 10 trials
    assert not converged([*flat[:9], 0.95], True)
    assert converged([1.0] * 10, False)


def test_completion_criteria_decisions_and_checks():
    target = CompletionCriteria(target=0.9)
    assert target.met([0.5, 0.89], True) is None
    assert target.met([0.5, 0.95], True) == ("TargetObjectiveMetricValue (0.9) was reached: a trial's objective is "
                                             "0.95")
    assert CompletionCriteria(target=0.1).met([0.5, 0.1], False) is not None
    assert CompletionCriteria(target=0.1).met([0.5, 0.2], False) is None
    patience = CompletionCriteria(max_not_improving=3)
    assert patience.met([0.5, 0.4, 0.45], True) is None
    assert "the last 3 trials did not improve" in (patience.met([0.5, 0.4, 0.45, 0.5], True) or "")
    conv = CompletionCriteria(on_convergence=True)
    assert conv.met([1.0] * 9, True) is None and "ConvergenceDetected" in (conv.met([1.0] * 10, True) or "")
    assert CompletionCriteria(on_convergence=False).met([1.0] * 10, True) is None
    req = TuningJobCompletionCriteriaConfig(5, True, 0.42).to_input_req()
    assert req == {"BestObjectiveNotImproving": {"MaxNumberOfTrainingJobsNotImproving": 5},
                   "ConvergenceDetected": {"CompleteOnConvergence": "Enabled"}, "TargetObjectiveMetricValue": 0.42}
    assert CompletionCriteria.from_request(req) == CompletionCriteria(0.42, 5, True)
    back = TuningJobCompletionCriteriaConfig.from_job_desc(req)
    assert (back.max_number_of_training_jobs_not_improving, back.complete_on_convergence,
            back.target_objective_metric_value) == (5, True, 0.42)
    off = TuningJobCompletionCriteriaConfig.from_job_desc(
        {"ConvergenceDetected": {"CompleteOnConvergence": "Disabled"}})
    assert off.complete_on_convergence is False and off.max_number_of_training_jobs_not_improving is None
    assert completion_problems(TuningJobCompletionCriteriaConfig(3, None, 1)) == []
    problems = completion_problems(TuningJobCompletionCriteriaConfig(2, "yes", "high"))
    assert [p.split(" must")[0] for p in problems] == [
        "completion_criteria_config max_number_of_training_jobs_not_improving",
        "completion_criteria_config target_objective_metric_value",
        "completion_criteria_config complete_on_convergence"]


def test_sdk_request_forms_of_the_config_classes():
    warm = WarmStartConfig(WarmStartTypes.TRANSFER_LEARNING, parents={"p2", "p1"})
    req = warm.to_input_req()
    assert req == {"WarmStartType": "TransferLearning", "ParentHyperParameterTuningJobs": [
        {"HyperParameterTuningJobName": "p1"}, {"HyperParameterTuningJobName": "p2"}]}
    back = WarmStartConfig.from_job_desc(req)
    assert back is not None and back.type is WarmStartTypes.TRANSFER_LEARNING and back.parents == {"p1", "p2"}
    assert WarmStartConfig.from_job_desc(None) is None and WarmStartConfig.from_job_desc({"WarmStartType": "x"}) is None
    strategy = StrategyConfig(HyperbandStrategyConfig(max_resource=10, min_resource=1))
    assert strategy.to_input_req() == {"HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 10}}
    again = StrategyConfig.from_job_desc(strategy.to_input_req()).hyperband_strategy_config
    assert (again.min_resource, again.max_resource) == (1, 10)


# --- warm start ----------------------------------------------------------------------------------------------------

def _parent(tstore: TuningStore, name: str, tuner: HyperparameterTuner, trials: list[dict], status: str = "Completed",
            entry_point: str = "train.py") -> None:
    config = tuner.tuning_config(name)
    config["template"] = {"entry_point": entry_point, "source_dir": "/src", "inputs": {}}
    tstore.create(name, config)
    state = tstore.state(name)
    state.update(status=status, trials=trials, ended=time.time() if status != "InProgress" else None)
    tstore.write_state(name, state)


def _trial(name: str, tuned: dict, objective: float | None, status: str = "Completed") -> dict:
    return {"name": name, "tuned": tuned, "created": time.time(), "status": status, "objective": objective,
            "started": time.time(), "ended": time.time(), "failure_reason": None}


def test_warm_start_checks(estimator, tmp_path):
    tstore = TuningStore(estimator.store)
    ranges = {"lr": ContinuousParameter(0.1, 1.0)}
    parent = HyperparameterTuner(estimator, "acc", ranges, max_jobs=3)
    _parent(tstore, "p1", parent, [_trial("p1-001", {"lr": 0.5}, 0.7), _trial("p1-002", {"lr": 0.9}, None, "Failed"),
                                   _trial("p1-003", {"lr": 0.2}, 0.4, "Stopped")])
    _parent(tstore, "running", parent, [], status="InProgress")
    _parent(tstore, "other-code", parent, [], entry_point="other.py")
    template = {"entry_point": "train.py", "source_dir": "/src", "inputs": {}}

    def check(parents, warm_type="IdenticalDataAndAlgorithm", metric="acc", ranges=ranges, static=None):
        return parent_problems(tstore, warm_type, parents, metric, ranges, static or {"epochs": 9}, template)

    assert check(["p1"]) == []
    assert check(["p1"], ranges={"lr": ContinuousParameter(0.01, 0.3)}) == []  # ranges may change
    problems = check(["nope", "running", "other-code"])
    assert "warm_start_config parent 'nope': no such tuning job" in problems[0]
    assert "warm_start_config parent 'running' is InProgress: a parent must have ended" in problems[1]
    assert "'other-code' ran another training script or data (entry_point differ)" in problems[2]
    assert check(["other-code"], warm_type="TransferLearning") == []
    assert "tuned objective 'acc', not 'loss'" in check(["p1"], metric="loss")[0]
    assert "has 2 static and tuned hyperparameters, this tuning job 3" in check(
        ["p1"], static={"epochs": 9, "extra": 1})[0]
    assert "tuned lr as Continuous, this tuning job as Integer" in check(
        ["p1"], ranges={"lr": IntegerParameter(1, 3)})[0]
    # lr tuned -> static (1 change) and epochs 9 -> 10 (2 changes): fine; a categorical of 11 values made static: not
    assert check(["p1"], ranges={"x": IntegerParameter(1, 2)}, static={"epochs": 10, "lr": 0.5})[1:] == []
    wide = HyperparameterTuner(estimator, "acc", {"c": CategoricalParameter(list(range(11)))}, max_jobs=1)
    _parent(tstore, "wide", wide, [])
    assert "11 changes from tuned to static" in check(["wide"], ranges={"lr": ContinuousParameter(0.1, 1)},
                                                      static={"c": "1", "epochs": 9})[0]
    assert warm_start_problems(WarmStartConfig(WarmStartTypes.TRANSFER_LEARNING, [f"p{i}" for i in range(6)])) == [
        "warm_start_config has 6 parents; a tuning job is warm started from at most 5: keep the best 5"]
    # the parents' trials with an objective, with the hyperparameters they ran with
    got = parent_trials(tstore, ["p1", "gone"])
    assert [(t["name"], t["status"], t["hyperparameters"]) for t in got] == [
        ("p1-001", "Completed", {"epochs": "9", "lr": "0.5"}), ("p1-003", "Stopped", {"epochs": "9", "lr": "0.2"})]
    # the tuner checks the parents when it starts, before anything runs
    child = HyperparameterTuner(estimator, "acc", ranges, max_jobs=1,
                                warm_start_config=WarmStartConfig(WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM,
                                                                  {"running"}))
    with pytest.raises(SpecError, match="'running' is InProgress"):
        child.fit(job_name="child", wait=False)
    assert "child" not in tstore.names()


def _objective(p: dict) -> float:
    return -((float(p["x"]) - 1.3) ** 2) - (0.0 if p["act"] == "tanh" else 0.5)


def test_a_bayesian_study_takes_the_parents_trials_in_its_ranges():
    ranges = {"x": ContinuousParameter(-5, 5), "act": CategoricalParameter(["relu", "tanh"]),
              "n": IntegerParameter(1, 4), "m": ContinuousParameter(0.5, 0.99, "ReverseLogarithmic")}
    search = BayesianSearch(ranges, True, 0)
    told = search.warm([
        ({"x": "1.2", "act": "tanh", "n": "2", "m": "0.9"}, 0.9, "Completed"),
        ({"x": "1.0", "act": "relu", "n": "4", "m": "0.5"}, 0.2, "Stopped"),
        ({"x": "9.0", "act": "tanh", "n": "2", "m": "0.9"}, 1.0, "Completed"),  # x out of range
        ({"x": "1.0", "act": "sigmoid", "n": "2", "m": "0.9"}, 1.0, "Completed"),  # not a value of act
        ({"x": "1.0", "act": "tanh", "n": "2.5", "m": "0.9"}, 1.0, "Completed"),  # not an integer
        ({"x": "1.0", "act": "tanh", "m": "0.9"}, 1.0, "Completed"),  # n missing
    ])
    assert told == 2
    trials = search._study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    assert trials[0].params == {"x": 1.2, "act": "tanh", "n": 2, "m": pytest.approx(0.1)}
    assert search._study.best_value == 0.9
    # reused results help: a study warm started with 20 earlier trials finds better values in its first 8 than a
    # cold one with the same seeds (averaged over seeds)
    ranges2 = {"x": ContinuousParameter(-5, 5), "act": CategoricalParameter(["relu", "tanh"])}
    earlier = make_search("Random", ranges2, True, 99)
    history = []
    for _ in range(20):
        _, p = earlier.suggest()  # type: ignore[misc]
        history.append(({k: str(v) for k, v in p.items()}, _objective(p), "Completed"))

    def first_best(warm: bool, seed: int) -> float:
        s = BayesianSearch(ranges2, True, seed)
        if warm:
            assert s.warm(history) == 20
        return max(_objective(s.suggest()[1]) for _ in range(8))  # type: ignore[index]

    warm_mean = statistics.fmean(first_best(True, seed) for seed in range(4))
    cold_mean = statistics.fmean(first_best(False, seed) for seed in range(4))
    assert warm_mean > cold_mean and math.isfinite(warm_mean), (warm_mean, cold_mean)
    assert make_search("Random", ranges2, True, 1).warm(history) == 0


# --- spec keys -----------------------------------------------------------------------------------------------------

def test_the_spec_takes_the_three_configs(tmp_path):
    from hora.jobs.tuning_spec import load_tuning_spec

    (tmp_path / "train.py").write_text("print('acc=1')\n")
    spec = tmp_path / "tune.yaml"
    spec.write_text(textwrap.dedent("""
        entry_point: train.py
        hyperparameters: {epochs: 9}
        metric_definitions: [{Name: acc, Regex: 'acc=([0-9.]+)'}]
        tuning:
          objective_metric_name: acc
          strategy: Hyperband
          max_jobs: 4
          strategy_config: {hyperband_strategy_config: {min_resource: 1, max_resource: 9}}
          completion_criteria_config:
            target_objective_metric_value: 0.95
            max_number_of_training_jobs_not_improving: 3
          warm_start_config: {type: TransferLearning, parents: [old-job]}
          hyperparameter_ranges:
            lr: {type: Continuous, min_value: 0.001, max_value: 0.1}
    """))
    tuner, _ = load_tuning_spec(str(spec), home=tmp_path / "home")
    assert tuner.strategy_config is not None and tuner.strategy_config.hyperband_strategy_config.max_resource == 9
    assert tuner.completion_criteria_config is not None
    assert tuner.completion_criteria_config.target_objective_metric_value == 0.95
    assert tuner.warm_start_config is not None and tuner.warm_start_config.parents == {"old-job"}
    assert tuner.warm_start_config.type is WarmStartTypes.TRANSFER_LEARNING
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""
        entry_point: train.py
        metric_definitions: [{Name: acc, Regex: 'acc=([0-9.]+)'}]
        tuning:
          objective_metric_name: acc
          warm_start_config: {type: Identical, parents: [a]}
          completion_criteria_config: {target: 1}
          hyperparameter_ranges:
            lr: {type: Continuous, min_value: 0.001, max_value: 0.1}
    """))
    with pytest.raises(SpecError) as err:
        load_tuning_spec(str(bad), home=tmp_path / "home")
    text = str(err.value)
    assert "tuning.warm_start_config.type 'Identical' must be IdenticalDataAndAlgorithm or TransferLearning" in text
    assert "unknown field 'target' in tuning.completion_criteria_config" in text
