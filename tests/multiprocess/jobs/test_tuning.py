"""Tuning jobs end to end: trials are real hora jobs started by a detached supervisor, at most max_parallel_jobs at
once; a failing trial is counted and never best; describe / analytics in the SDK's shape; attach from another
process; the median rule stops a poor trial; hora job tune SPEC / list / describe / stop; Hyperband stops a poor
trial at a rung; a warm-started child reuses its parent's results; a target value completes a tuning job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hora.cli import main
from hora.errors import ConfigError, UnexpectedStatusException
from hora.jobs import (
    CategoricalParameter,
    Estimator,
    HyperbandStrategyConfig,
    HyperparameterTuner,
    IntegerParameter,
    JobStore,
    StrategyConfig,
    TuningJobCompletionCriteriaConfig,
    WarmStartConfig,
    WarmStartTypes,
    stop_job,
    wait_job,
)
from hora.jobs.tuning import wait_tuning_job
from hora.jobs.tuning_store import TuningStore
from support import paths
from support.intervals import most_at_once

pd = pytest.importorskip("pandas")

#: Prints acc=<width/10 + epoch/100> per epoch; --mode fail exits 3; --mode hold (or a width below --hold_below)
#: sleeps 2 minutes after its first epoch (until stopped).
SCRIPT = """
import argparse, sys, time
p = argparse.ArgumentParser()
p.add_argument("--width", type=float, default=0)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--pause", type=float, default=0)
p.add_argument("--mode", default="ok")
p.add_argument("--hold_below", type=float, default=-1)
a, _ = p.parse_known_args()
if a.mode == "fail":
    print("boom: this configuration cannot train", file=sys.stderr)
    sys.exit(3)
for e in range(a.epochs):
    print(f"epoch {e} acc={a.width / 10 + e / 100:.4f}", flush=True)
    time.sleep(a.pause)
    if a.mode == "hold" or a.width < a.hold_below:
        time.sleep(120)
"""
METRICS = [{"Name": "acc", "Regex": r"acc=([0-9.]+)"}]


def _estimator(tmp_path, **hps) -> Estimator:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    return Estimator(home=str(tmp_path / "home"), entry_point="train.py", source_dir=str(src),
                     hyperparameters={"epochs": 3, **hps}, metric_definitions=METRICS)


def test_a_grid_tuning_job_runs_two_trials_at_a_time_counts_the_failing_one_and_attaches_elsewhere(tmp_path):
    est = _estimator(tmp_path, pause=0.5)
    ranges = {"width": CategoricalParameter([1, 7, 3, 5]), "mode": CategoricalParameter(["ok", "fail"])}
    tuner = HyperparameterTuner(est, "acc", ranges, strategy="Grid", max_parallel_jobs=2)
    tuner.fit(job_name="grid", wait=True)
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Completed"
    assert desc["HyperParameterTuningJobConfig"]["ResourceLimits"] == {
        "MaxNumberOfTrainingJobs": 8, "MaxParallelTrainingJobs": 2}
    assert desc["TrainingJobStatusCounters"] == {
        "Completed": 4, "InProgress": 0, "RetryableError": 0, "NonRetryableError": 4, "Stopped": 0}
    assert desc["ObjectiveStatusCounters"] == {"Succeeded": 4, "Pending": 0, "Failed": 4}
    assert desc["TrainingJobDefinition"]["StaticHyperParameters"] == {"epochs": "3", "pause": "0.5"}
    assert desc["TrainingJobDefinition"]["ResourceConfig"] == {"InstanceType": "local", "InstanceCount": 1}
    best = desc["BestTrainingJob"]
    assert best["TunedHyperParameters"] == {"width": "7", "mode": "ok"}
    assert best["FinalHyperParameterTuningJobObjectiveMetric"] == {"Type": "Maximize", "MetricName": "acc",
                                                                   "Value": pytest.approx(0.72)}
    assert tuner.best_training_job() == best["TrainingJobName"]
    # the trials are ordinary jobs: their own records, hyperparameters and metrics
    store = JobStore(tmp_path / "home")
    trials = {r.name: r for r in store.jobs()}
    assert len(trials) == 8 and all(n.startswith("grid-") for n in trials)
    failed = [r for r in trials.values() if r.status == "Failed"]
    assert len(failed) == 4 and all(r.spec["hyperparameters"]["mode"] == "fail" for r in failed)
    assert all("boom: this configuration cannot train" in (r.failure_reason or "") for r in failed)
    record = trials[best["TrainingJobName"]]
    assert record.spec["hyperparameters"] == {"epochs": 3, "pause": 0.5, "width": "7", "mode": "ok"}
    assert [m[1] for m in store.metrics(record.name)] == pytest.approx([0.7, 0.71, 0.72])
    # at most two at once, and two did run at once
    assert most_at_once([(r.created, r.ended) for r in trials.values()]) == 2  # type: ignore[misc]
    df = tuner.analytics().dataframe()
    assert list(df.columns) == ["width", "mode", "TrainingJobName", "TrainingJobStatus", "FinalObjectiveValue",
                                "TrainingStartTime", "TrainingEndTime", "TrainingElapsedTimeSeconds"]
    assert sorted(df["TrainingJobName"]) == sorted(trials)
    ok = df[df["TrainingJobStatus"] == "Completed"].sort_values("width")
    assert list(ok["width"]) == [1.0, 3.0, 5.0, 7.0]
    assert list(ok["FinalObjectiveValue"]) == pytest.approx([0.12, 0.32, 0.52, 0.72])
    assert df[df["TrainingJobStatus"] == "Failed"]["FinalObjectiveValue"].isna().all()
    assert (df["TrainingElapsedTimeSeconds"] > 0).all()
    best_est = tuner.best_estimator()
    assert best_est.model_data == record.artifacts["model"]
    assert best_est.fields["hyperparameters"]["width"] == "7"
    # another process attaches by name and sees the same
    code = textwrap.dedent(f"""
        import json
        from hora.jobs import HyperparameterTuner
        t = HyperparameterTuner.attach("grid", home={str(tmp_path / "home")!r})
        df = t.analytics().dataframe()
        print(json.dumps([t.best_training_job(), t.describe()["HyperParameterTuningJobStatus"], t.strategy,
                          sorted(df["TrainingJobName"])]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(paths.SRC)))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [best["TrainingJobName"], "Completed", "Grid", sorted(trials)]


def test_random_with_a_seed_repeats_its_values_and_early_stopping_stops_a_poor_trial(tmp_path):
    est = _estimator(tmp_path)
    ranges = {"width": IntegerParameter(1, 9)}
    first = HyperparameterTuner(est, "acc", ranges, strategy="Random", max_jobs=3, random_seed=11)
    first.fit(job_name="rand-a")
    again = HyperparameterTuner(est, "acc", ranges, strategy="Random", max_jobs=3, random_seed=11)
    again.fit(job_name="rand-b")
    values = [list(first.analytics().dataframe()["width"]), list(again.analytics().dataframe()["width"])]
    assert values[0] == values[1] and all(1 <= v <= 9 for v in values[0])
    # early stopping: three good trials, then one whose first epoch is poor and which would then hold for 2 min
    est = _estimator(tmp_path, hold_below=2)
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([8, 9, 7, 1])}, strategy="Grid",
                                early_stopping_type="Auto")
    tuner.fit(job_name="es")
    trials = {t["TunedHyperParameters"]["width"]: t for t in tuner.analytics().training_job_summaries()}
    assert {w: t["TrainingJobStatus"] for w, t in trials.items()} == {
        "8": "Completed", "9": "Completed", "7": "Completed", "1": "Stopped"}
    assert trials["1"]["FailureReason"] == (
        "stopped early (median rule): objective 0.1 at epoch 1 is worse than 0.8, the median of 3 earlier trials' "
        "running averages up to that epoch")
    assert JobStore(tmp_path / "home").get(trials["1"]["TrainingJobName"]).status == "Stopped"
    assert tuner.describe()["TrainingJobStatusCounters"]["Stopped"] == 1
    assert tuner.best_training_job() == trials["9"]["TrainingJobName"]


def _has_supervisor(store: JobStore, state: dict) -> bool:
    """Whether the tuning job's first trial runs under its own supervisor yet."""
    try:
        return bool(state["trials"]) and store.get(state["trials"][0]["name"]).supervisor_pid is not None
    except ConfigError:  # named in the tuning job's state, not yet created
        return False


def test_max_runtime_stops_a_tuning_job_and_a_killed_supervisor_fails_it(tmp_path):
    est = _estimator(tmp_path, mode="hold")
    ranges = {"width": IntegerParameter(1, 9)}
    tuner = HyperparameterTuner(est, "acc", ranges, strategy="Random", max_jobs=3, max_runtime_in_seconds=3)
    tuner.fit(job_name="short")  # its first trial holds for 2 minutes: the limit stops it
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Stopped"
    assert desc["FailureReason"] == "MaxRuntimeInSeconds (3) was reached"
    assert desc["TrainingJobStatusCounters"] == {
        "Completed": 0, "InProgress": 0, "RetryableError": 0, "NonRetryableError": 0, "Stopped": 1}
    # a supervisor killed outright: the next look marks the tuning job Failed, wait() raises, nothing hangs
    killed = HyperparameterTuner(est, "acc", ranges, strategy="Random", max_jobs=2)
    killed.fit(job_name="killed", wait=False)
    tstore = TuningStore(est.store)
    deadline = time.monotonic() + 60
    while tstore.supervisor_pid("killed") is None or not _has_supervisor(est.store, tstore.state("killed")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(tstore.supervisor_pid("killed"), signal.SIGKILL)  # type: ignore[arg-type]
    assert wait_tuning_job(tstore, "killed", timeout=60)["status"] == "Failed"
    with pytest.raises(UnexpectedStatusException, match=re.escape(
            "Error for HyperParameterTuning job killed: Failed. Reason: InternalError: the tuning job's supervisor "
            "died without finishing it")):
        killed.wait()
    trial = tstore.state("killed")["trials"][0]["name"]
    stop_job(est.store, trial)  # its trial was left running: stop it
    assert wait_job(est.store, trial, timeout=60).status == "Stopped"


def test_hora_job_tune_spec_list_describe_and_stop(tmp_path, capsys):
    _estimator(tmp_path)
    spec = tmp_path / "tune.yaml"
    spec.write_text(textwrap.dedent("""
        entry_point: train.py
        source_dir: src
        hyperparameters: {epochs: 2, mode: hold}
        metric_definitions: [{Name: acc, Regex: 'acc=([0-9.]+)'}]
        tuning:
          job_name: held
          objective_metric_name: acc
          strategy: Random
          max_jobs: 5
          max_parallel_jobs: 2
          early_stopping_type: Off
          hyperparameter_ranges:
            width: {type: Continuous, min_value: 0.5, max_value: 2, scaling_type: Logarithmic}
    """))
    home = str(tmp_path / "home")
    assert main(["job", "--home", home, "tune", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "started tuning job held (Random: 5 trial(s), at most 2 at once)" in out
    tstore = TuningStore(JobStore(home))
    deadline = time.monotonic() + 120
    while len([t for t in tstore.state("held")["trials"] if t.get("series")]) < 2:
        assert time.monotonic() < deadline, tstore.state("held")
        time.sleep(0.2)
    assert main(["job", "--home", home, "tune", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "STATUS", "STRATEGY", "TRIALS", "BEST", "CREATED"]
    assert out.splitlines()[1].split()[:4] == ["held", "InProgress", "Random", "0/5"]
    assert main(["job", "--home", home, "tune", "stop", "held", "--wait"]) == 0
    out = capsys.readouterr().out
    assert "stopping tuning job held" in out and "tuning job held: Stopped, 2 trial(s)" in out
    state = tstore.state("held")
    assert [t["status"] for t in state["trials"]] == ["Stopped", "Stopped"]
    assert state["failure_reason"] == "stopped by request"
    assert main(["job", "--home", home, "tune", "describe", "held"]) == 0
    out = capsys.readouterr().out
    assert "Status:            Stopped" in out and "width: 0.5 .. 2 (Logarithmic)" in out
    assert "Static:            epochs=2, mode=hold" in out
    # the trials stay ordinary jobs: hora job list shows them, hora job rm removes one, describe still works
    trial = state["trials"][0]["name"]
    assert main(["job", "--home", home, "rm", trial]) == 0
    assert main(["job", "--home", home, "tune", "describe", "held"]) == 0
    assert trial in capsys.readouterr().out
    assert main(["job", "--home", home, "reindex"]) == 0  # the tuning/ directory is none of its business
    assert capsys.readouterr().out.splitlines()[-1].startswith("indexed 0 job(s)")
    # a bad tuning section: every problem named, with the spec
    bad = tmp_path / "bad.yaml"
    bad.write_text("entry_point: train.py\nsource_dir: src\ntuning:\n  objective_metric_name: loss\n  stratgy: Random\n"
                   "  hyperparameter_ranges:\n    lr: {type: Float, min_value: 0}\n")
    assert main(["job", "--home", home, "tune", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'stratgy' in tuning; did you mean 'strategy'?" in err, err
    assert "tuning.hyperparameter_ranges.lr: type 'Float' must be Continuous, Integer or Categorical" in err


def test_hyperband_stops_a_poor_trial_at_its_brackets_rung(tmp_path):
    # MaxResource 3, MinResource 1: bracket 0 judges at epoch 1, bracket 1 never; trials alternate between them.
    # Seed 1 draws widths 8, 8, 1: the third trial (bracket 0) is worse than the first at epoch 1 and would then
    # hold for 2 minutes
    est = _estimator(tmp_path, epochs=5, hold_below=2)
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([8, 1])}, strategy="Hyperband",
                                strategy_config=StrategyConfig(HyperbandStrategyConfig(max_resource=3,
                                                                                       min_resource=1)),
                                max_jobs=3, random_seed=1)
    tuner.fit(job_name="hb")
    summaries = tuner.analytics().training_job_summaries()
    assert [(s["TunedHyperParameters"]["width"], s["TrainingJobStatus"]) for s in summaries] == [
        ("8", "Completed"), ("8", "Completed"), ("1", "Stopped")]
    assert summaries[2]["FailureReason"] == (
        "stopped early (Hyperband): objective 0.1 at epoch 1 (a rung of bracket 0) is not among the best 1 of the 2 "
        "trials of the bracket that reached it (the 1st best is 0.8)")
    store = JobStore(tmp_path / "home")
    # every trial may run MaxResource epochs: the static epochs (5) is replaced
    assert [store.get(s["TrainingJobName"]).spec["hyperparameters"]["epochs"] for s in summaries] == [3, 3, 3]
    assert len(store.metrics(summaries[0]["TrainingJobName"])) == 3
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobConfig"]["StrategyConfig"] == {
        "HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 3}}
    again = HyperparameterTuner.attach("hb", home=str(tmp_path / "home"))
    assert again.strategy_config is not None and again.strategy_config.to_input_req() == {
        "HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 3}}


def test_a_warm_started_bayesian_child_reuses_its_parents_results(tmp_path):
    est = _estimator(tmp_path)
    parent = HyperparameterTuner(est, "acc", {"width": IntegerParameter(1, 9)}, strategy="Random", max_jobs=3,
                                 random_seed=0)  # widths 7, 7, 1
    parent.fit(job_name="ws-parent")
    twin = parent.identical_dataset_and_algorithm_tuner(additional_parents={"other"})
    assert twin.warm_start_config is not None and twin.warm_start_config.parents == {"ws-parent", "other"}
    assert twin.warm_start_config.type is WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM
    assert (twin.strategy, twin.max_jobs, twin.random_seed) == ("Random", 3, 0)
    # a Bayesian child on a narrower range: the parent's trial inside it (width 1) is told to its study
    warm = WarmStartConfig(WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM, {"ws-parent"})
    child = HyperparameterTuner(est, "acc", {"width": IntegerParameter(1, 4)}, strategy="Bayesian", max_jobs=1,
                                random_seed=3, warm_start_config=warm)
    child.fit(job_name="ws-child")
    tstore = TuningStore(est.store)
    assert tstore.state("ws-child")["warm_start"] == {"parent_trials": 3, "told": 1}
    desc = child.describe()
    assert desc["WarmStartConfig"] == {"WarmStartType": "IdenticalDataAndAlgorithm",
                                       "ParentHyperParameterTuningJobs": [{"HyperParameterTuningJobName": "ws-parent"}]}
    own = desc["BestTrainingJob"]
    assert own["TrainingJobName"].startswith("ws-child-") and child.best_training_job() == own["TrainingJobName"]
    overall = desc["OverallBestTrainingJob"]  # the parent's first width-7 trial: 0.72 beats any width <= 4
    assert overall["TuningJobName"] == "ws-parent"
    assert overall["TrainingJobName"] == tstore.state("ws-parent")["trials"][0]["name"]
    assert overall["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == pytest.approx(0.72)
    attached = HyperparameterTuner.attach("ws-child", home=str(tmp_path / "home"))
    assert attached.warm_start_config is not None and attached.warm_start_config.parents == {"ws-parent"}


def test_a_tuning_job_completes_when_a_trial_reaches_the_target_and_stops_the_running_one(tmp_path):
    est = _estimator(tmp_path, hold_below=2)
    criteria = TuningJobCompletionCriteriaConfig(target_objective_metric_value=0.6)
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([7, 1, 3, 5])}, strategy="Grid",
                                max_parallel_jobs=2, completion_criteria_config=criteria)
    tuner.fit(job_name="target")  # width 7 reaches 0.72; width 1 holds after its first epoch until stopped
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Completed" and "FailureReason" not in desc
    assert desc["HyperParameterTuningJobConfig"]["TuningJobCompletionCriteria"] == {"TargetObjectiveMetricValue": 0.6}
    assert desc["TuningJobCompletionDetails"] == {"NumberOfTrainingJobsObjectiveNotImproving": 0}
    summaries = {s["TunedHyperParameters"]["width"]: s for s in tuner.analytics().training_job_summaries()}
    assert sorted(summaries) == ["1", "7"]  # 3 and 5 never started
    assert summaries["7"]["TrainingJobStatus"] == "Completed"
    assert summaries["1"]["TrainingJobStatus"] == "Stopped"
    assert summaries["1"]["FailureReason"] == ("stopped: the tuning job is complete (TargetObjectiveMetricValue (0.6) "
                                               "was reached: a trial's objective is 0.72)")
    assert TuningStore(est.store).state("target")["completion_reason"].startswith("TargetObjectiveMetricValue")
