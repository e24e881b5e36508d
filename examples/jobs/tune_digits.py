"""Tune digits_train.py on scikit-learn's digits, written as a SageMaker SDK user writes it: an Estimator, a
HyperparameterTuner with metric_definitions, fit() with the channels, then analytics() and the best training job.

    python examples/jobs/tune_digits.py --data-dir /tmp/digits

On SageMaker the imports would be ``from sagemaker.estimator import Estimator`` (which also needs ``image_uri`` and
``role``) and ``from sagemaker.tuner import ...``, the channels ``s3://`` URIs and ``instance_type`` an ``ml.*`` one;
everything else is the same (``model_data`` is then an ``s3://`` URI to download before loading). Here
each of the 6 trials is a hora job (1 host x 2 processes, data-parallel with hora.numpy), 2 at a time, in the jobs
home (``~/.hora``, or ``$HORA_JOB_HOME``): ``hora job tune describe NAME`` and ``hora dashboard`` show them.

The digits are split once (seeded) into training, validation and test rows: the tuner maximises the validation
accuracy; the best trial's model is then loaded from its model archive and scored on the test rows, which no trial
has seen.
"""

from __future__ import annotations

import argparse
import os
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from hora.jobs import (
    CategoricalParameter,
    ContinuousParameter,
    Estimator,
    HyperparameterTuner,
)

HERE = Path(__file__).resolve().parent


def write_channels(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Write the training and validation channels (CSV, label first) under ``data_dir``; return the test rows."""
    digits = load_digits()
    x, y = digits.data, digits.target
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=0.25, random_state=0, stratify=y_rest)
    header = "label," + ",".join(f"p{i}" for i in range(x.shape[1]))
    for channel, xs, ys in (("training", x_train, y_train), ("validation", x_val, y_val)):
        (data_dir / channel).mkdir(parents=True, exist_ok=True)
        np.savetxt(data_dir / channel / f"{channel}.csv", np.column_stack([ys, xs]), delimiter=",", fmt="%g",
                   header=header, comments="")
    return x_test, y_test


def load_model(model_data: str) -> np.ndarray:
    """The weights in a trial's model archive (model.tar.gz, as SageMaker packs SM_MODEL_DIR)."""
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(model_data) as archive:
        archive.extractall(tmp, filter="data")
        return np.load(os.path.join(tmp, "weights.npy"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="where to write the channels (default: a temporary directory)")
    p.add_argument("--job-name", default=None, help="the tuning job's name (default: generated)")
    p.add_argument("--strategy", default="Bayesian", choices=["Bayesian", "Random"])
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="digits-"))
    x_test, y_test = write_channels(data_dir)

    estimator = Estimator(
        entry_point="digits_train.py",
        source_dir=str(HERE),
        instance_count=1,
        instance_type="local",
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
        hyperparameters={"epochs": 8},
        max_run=600,
    )
    tuner = HyperparameterTuner(
        estimator,
        objective_metric_name="validation:accuracy",
        objective_type="Maximize",
        metric_definitions=[
            {"Name": "validation:accuracy", "Regex": r"validation_accuracy=([0-9\.]+)"},
            {"Name": "train:loss", "Regex": r"train_loss=([0-9\.]+)"},
        ],
        hyperparameter_ranges={
            "learning-rate": ContinuousParameter(0.01, 5.0, scaling_type="Logarithmic"),
            "l2": ContinuousParameter(1e-6, 0.01, scaling_type="Logarithmic"),
            "batch-size": CategoricalParameter([16, 64, 256]),
        },
        strategy=args.strategy,
        random_seed=args.seed,
        max_jobs=6,
        max_parallel_jobs=2,
        base_tuning_job_name="digits",
    )
    tuner.fit({"training": str(data_dir / "training"), "validation": str(data_dir / "validation")},
              job_name=args.job_name)

    df = tuner.analytics().dataframe()
    print(df.sort_values("FinalObjectiveValue", ascending=False).to_string(index=False))
    best = tuner.best_training_job()
    print(f"best training job: {best}")
    weights = load_model(tuner.best_estimator().model_data)
    scores = x_test / 16.0 @ weights[:-1] + weights[-1]
    print(f"best model: test accuracy={np.mean(np.argmax(scores, axis=1) == y_test):.4f} on {len(y_test)} digits")


if __name__ == "__main__":
    main()
