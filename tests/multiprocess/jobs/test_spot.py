"""Managed spot training in ``hora job``: reclaims (``hora job interrupt``, the spec's schedule) restart the job from
its synced checkpoints, without using a retry, until it completes or ``max_wait`` passes."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from hora.errors import ConfigError
from hora.jobs import JobStore, parse_spec, start_job, wait_job
from hora.jobs.api import interrupt_job
from hora.jobs.estimator import _describe
from hora.jobs.spec import SpecError
from hora.jobs.views import read_logs

#: A script that resumes from checkpoints/epoch and saves it after every epoch (atomically, as a careful script).
RESUMING = """
    import os, time
    ckpt = os.path.join(os.environ["SM_MODEL_DIR"], "..", "checkpoints")
    path = os.path.join(ckpt, "epoch")
    start = int(open(path).read()) if os.path.exists(path) else 0
    print(f"resumed at epoch {start}", flush=True)
    for epoch in range(start, 20):
        time.sleep(0.25)
        with open(path + ".tmp", "w") as f:
            f.write(str(epoch + 1))
        os.replace(path + ".tmp", path)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w").write("trained")
"""


def _spec(tmp_path: Path, name: str, script: str, **fields):
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "train.py").write_text(textwrap.dedent(script))
    return parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name, **fields})


def _epoch(ckpt: Path) -> int:
    try:
        return int((ckpt / "epoch").read_text())
    except (OSError, ValueError):
        return 0


def test_a_spot_job_interrupted_twice_resumes_from_its_checkpoint_and_completes(tmp_path):
    ckpt = tmp_path / "ckpt"
    spec = _spec(tmp_path, "spot", RESUMING, use_spot_instances=True, max_run=120, max_wait=300,
                 checkpoint_path=str(ckpt), max_retry_attempts=0)
    store = JobStore(tmp_path / "home")
    start_job(spec, store, wait=False, echo=False)
    for at_least in (4, 12):  # reclaim once the synced checkpoint shows this many epochs
        deadline = time.monotonic() + 120
        while _epoch(ckpt) < at_least:
            assert time.monotonic() < deadline, f"the synced checkpoint never reached epoch {at_least}"
            assert not store.get("spot").done, store.get("spot").failure_reason
            time.sleep(0.1)
        interrupt_job(store, "spot", "algo-1")
        while store.get("spot").secondary_status != "Training" or store.get("spot").attempts < 2 + (at_least > 4):
            assert time.monotonic() < deadline and not store.get("spot").done, store.get("spot").failure_reason
            time.sleep(0.1)
    record = wait_job(store, "spot", timeout=180)
    assert record.status == "Completed", record.failure_reason
    assert record.attempts == 3  # two reclaims, and no retry was used (max_retry_attempts 0)
    secondaries = [t[2] for t in store.transitions("spot")]
    assert secondaries.count("Interrupted") == 2 and secondaries.count("Restarting") == 2
    resumed = [int(line.rsplit(" ", 1)[1]) for line in read_logs(store, "spot") if "resumed at epoch" in line]
    assert resumed[0] == 0 and resumed[1] >= 4 and resumed[2] >= 12  # each restart from the synced checkpoint
    assert _epoch(ckpt) == 20
    described = _describe(store, record)
    assert described["EnableManagedSpotTraining"] is True
    assert described["StoppingCondition"] == {"MaxRuntimeInSeconds": 120, "MaxWaitTimeInSeconds": 300}
    assert 0 < described["BillableTimeInSeconds"] <= described["TrainingTimeInSeconds"]
    assert [s["Status"] for s in described["SecondaryStatusTransitions"]].count("Interrupted") == 2


def test_past_max_wait_a_spot_job_ends_with_sagemakers_reason(tmp_path):
    # reclaimed by the spec's schedule at 1 s, again at 4 s; max_wait ends it at 5 s whatever it was doing
    script = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    spec = _spec(tmp_path, "too-long", script, use_spot_instances=True, max_run=4, max_wait=5,
                 spot_interruptions=[1, 4])
    store = JobStore(tmp_path / "home")
    record = start_job(spec, store, wait=True, echo=False)
    assert (record.status, record.secondary_status) == ("Stopped", "MaxWaitTimeExceeded")
    assert record.failure_reason.startswith("MaxWaitTimeExceeded: the job, with its waits for spot capacity, took")
    assert "Interrupted" in [t[2] for t in store.transitions("too-long")]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"use_spot_instances": True}, "use_spot_instances needs max_wait"),
        ({"use_spot_instances": True, "max_run": 100, "max_wait": 50}, "Invalid MaxWaitTimeInSeconds"),
        ({"max_wait": 50}, "max_wait is only for managed spot training"),
        ({"spot_interruptions": [3]}, "spot_interruptions simulate reclaims"),
        ({"use_spot_instances": "yes", "max_wait": 10}, "use_spot_instances must be true or false"),
    ],
)
def test_spot_fields_follow_create_training_jobs_rules(tmp_path, fields, message):
    with pytest.raises(SpecError, match=message):
        _spec(tmp_path, "bad", "pass\n", **fields)


def test_only_a_running_spot_job_can_be_interrupted(tmp_path):
    store = JobStore(tmp_path / "home")
    start_job(_spec(tmp_path, "plain", "print('hi')\n"), store, wait=True, echo=False)
    with pytest.raises(ConfigError, match="does not use spot instances"):
        interrupt_job(store, "plain")
    from hora.cli import main

    assert main(["job", "--home", str(store.home), "interrupt", "plain"]) == 2  # the same error, as exit 2
