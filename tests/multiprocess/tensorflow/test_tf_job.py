"""examples/jobs/tf_job.yaml as docs/tensorflow.md runs it: a SageMaker script-mode TensorFlow Horovod script with
two processes reading a Pipe-mode channel, its metrics parsed from the log and its model saved."""

from __future__ import annotations

import importlib.util
import tarfile
from pathlib import Path

import pytest

from hora.jobs import JobStore, load_spec, start_job
from support import paths

# find_spec, not importorskip: the job imports TensorFlow, this process need not
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tensorflow extra")
EXAMPLE = paths.REPO / "examples" / "jobs" / "tf_job.yaml"


def test_the_tensorflow_pipe_mode_example_job_trains(tmp_path):
    store = JobStore(tmp_path / "home")
    spec = load_spec(EXAMPLE, {"job_name": "tf-example"})
    record = start_job(spec, store, wait=True, echo=False)
    log = (Path(record.job_dir) / "logs" / "algo-1.log").read_text()
    assert record.status == "Completed", f"{record.failure_reason}\n{log[-6000:]}"
    metrics = store.metrics("tf-example")
    accuracy = [v for name, v, *_ in metrics if name == "test:accuracy"]
    assert len([v for name, v, *_ in metrics if name == "train:loss"]) == 1
    assert len(accuracy) == 1 and accuracy[0] > 0.85, accuracy
    with tarfile.open(record.artifacts["model"]) as tar:
        assert "model.keras" in tar.getnames()
