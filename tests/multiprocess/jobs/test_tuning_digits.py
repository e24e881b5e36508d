"""The SDK-shaped tuning example (examples/jobs/tune_digits.py) run as a user runs it: a seeded Bayesian tuning job of
6 real hora jobs (each 2 ranks training on digits with hora.numpy), 2 at a time; the best trial's model archive
loads and reads digits it never saw."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from hora.jobs import HyperparameterTuner, JobStore
from support import paths
from support.intervals import most_at_once

pytest.importorskip("pandas")
pytest.importorskip("optuna")
pytest.importorskip("sklearn")

EXAMPLE = paths.REPO / "examples" / "jobs" / "tune_digits.py"


def _example():
    spec = importlib.util.spec_from_file_location("tune_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_digits_example_is_tuned_end_to_end_six_trials_two_at_a_time(tmp_path):
    home = tmp_path / "home"
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--data-dir", str(tmp_path / "data"), "--job-name", "digits-e2e"],
        env={**os.environ, "HORA_JOB_HOME": str(home), "PYTHONPATH": str(paths.SRC)},
        capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr

    tuner = HyperparameterTuner.attach("digits-e2e", home=str(home))
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobStatus"] == "Completed"
    cfg = desc["HyperParameterTuningJobConfig"]
    assert (cfg["Strategy"], cfg["RandomSeed"]) == ("Bayesian", 3)
    assert cfg["ResourceLimits"] == {"MaxNumberOfTrainingJobs": 6, "MaxParallelTrainingJobs": 2}
    df = tuner.analytics().dataframe()
    assert len(df) == 6 and set(df["TrainingJobStatus"]) == {"Completed"}
    assert {"learning-rate", "l2", "batch-size", "FinalObjectiveValue"} <= set(df.columns)
    # never more than two at once (and two did run together), from the trials' own start and end times
    spans = [(s.timestamp(), e.timestamp()) for s, e in zip(df["TrainingStartTime"], df["TrainingEndTime"])]
    assert most_at_once(spans) == 2

    store = JobStore(home)
    for row in df.itertuples():
        record = store.get(row.TrainingJobName)
        assert record.status == "Completed"
        assert record.spec["hyperparameters"]["epochs"] == 8
        accuracy = [m[1] for m in store.metrics(record.name) if m[0] == "validation:accuracy"]
        assert len(accuracy) == 8 and row.FinalObjectiveValue == pytest.approx(accuracy[-1])
        with tarfile.open(record.artifacts["output"]) as archive:  # the script ran data-parallel on 2 ranks
            member = next(m for m in archive.getmembers() if m.name.endswith("summary.json"))
            summary = json.load(archive.extractfile(member) or io.BytesIO(b"{}"))
        assert summary["ranks"] == 2 and summary["validation_accuracy"] == pytest.approx(accuracy[-1], abs=1e-4)

    best = tuner.best_training_job()
    best_value = df.set_index("TrainingJobName").loc[best, "FinalObjectiveValue"]
    assert best_value == df["FinalObjectiveValue"].max()
    assert desc["BestTrainingJob"]["TrainingJobName"] == best
    assert f"best training job: {best}" in out.stdout

    # The best model, from its archive, reads the held-out test digits (the example's own split).
    model_data = tuner.best_estimator().model_data
    assert model_data == store.get(best).artifacts["model"] and os.path.isfile(model_data)
    example = _example()
    weights = example.load_model(model_data)
    assert weights.shape == (65, 10)
    x_test, y_test = example.write_channels(tmp_path / "again")
    accuracy = float(np.mean(np.argmax(x_test / 16.0 @ weights[:-1] + weights[-1], axis=1) == y_test))
    assert accuracy > 0.85, accuracy
    printed = re.search(r"best model: test accuracy=([0-9.]+) on 360 digits", out.stdout)
    assert printed is not None and float(printed.group(1)) == pytest.approx(accuracy, abs=1e-4)
