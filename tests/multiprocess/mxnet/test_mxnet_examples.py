"""examples/mxnet_digits.py under ``hora run -np 2``, and examples/mxnet_job.yaml as a hora job whose output
archive holds the timeline and the autotune log that custom_mpi_options' ``-x`` asked for. Run in .venv-mxnet."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import tarfile

import pytest

pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 needs numpy<1.24: these tests run in .venv-mxnet, the second pass of .ci/run"
)
pytest.importorskip("sklearn")
pytest.importorskip("yaml")

from hora.jobs import JobStore, load_spec, start_job
from hora.runner import run_command
from support import paths

REPO = paths.REPO
FINAL = re.compile(r"^final test accuracy: (\d\.\d+)$")


def test_example_trains_on_two_ranks_and_rank_0_saves(tmp_path):
    command = [sys.executable, str(REPO / "examples" / "mxnet_digits.py"), "--epochs", "4", "--model-dir", str(tmp_path)]
    result = run_command(command, np=2, capture=True, timeout=180, cwd=str(REPO))
    out = result.lines.get(0, {}).get("stdout", [])
    assert result.exit_code == 0, (result.report(), result.lines)
    finals = [float(m.group(1)) for line in out if (m := FINAL.match(line))]
    assert finals and finals[0] > 0.9, out
    assert result.lines[1]["stdout"] == [], "only rank 0 prints"
    assert (tmp_path / "digits-cnn.params").stat().st_size > 1000


def test_job_archives_the_timeline_and_the_autotune_log(tmp_path):
    store = JobStore(tmp_path / "home")
    spec = load_spec(REPO / "examples" / "mxnet_job.yaml", {"job_name": "mxnet-job"})
    assert spec.mpi_exports == {
        "HOROVOD_TIMELINE": "/opt/ml/output/data/timeline.json",
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "/opt/ml/output/data/autotune_log.csv",
    }
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    with tarfile.open(record.artifacts["output"]) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert {"timeline.json", "autotune_log.csv"} <= set(files), sorted(files)
    events = json.loads(files["timeline.json"])
    names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert "ALLREDUCE" in names or "NEGOTIATE_ALLREDUCE" in names, sorted(n for n in names if n)[:40]
    rows = list(csv.reader(io.StringIO(files["autotune_log.csv"].decode())))
    assert len(rows) >= 1, rows
    accuracy = [m for m in store.metrics("mxnet-job") if m[0] == "test:accuracy"]
    assert len(accuracy) == 3 and accuracy[-1][1] > 0.8, accuracy


def test_benchmark_smoke():
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "mxnet_training.py"), "--smoke"],
        capture_output=True, text=True, timeout=180, cwd=str(REPO),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("single-1", "hora-2"))]
    assert [r[0] for r in rows] == ["single-1", "hora-2"], proc.stdout
    assert rows[1][-2].startswith(("+", "-")) and rows[1][-1] == "ms", proc.stdout
