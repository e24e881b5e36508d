"""A job whose supervisor died is marked Failed when looked at, also when the dead supervisor is a zombie."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from hora._proc import process_start_time
from hora.jobs.api import reconcile
from hora.jobs.store import JobStore, write_private


def test_a_supervisor_left_as_a_zombie_counts_as_dead(tmp_path):
    """Under a subreaper that has not reaped it yet (hora's CLI is one), a dead supervisor is a zombie: its pid and
    start time still match. It used to count as alive, so the job was never marked Failed."""
    store = JobStore(tmp_path / "home")
    record = store.create("j", {"entry_point": "train.py"})
    child = subprocess.Popen(["sleep", "0.1"])
    try:
        start = process_start_time(child.pid)
        write_private(store.job_dir("j") / "hora" / "supervisor.json", json.dumps({"pid": child.pid, "start": start}))
        store.update("j", supervisor_pid=child.pid, started=time.time())
        deadline = time.monotonic() + 30
        while b") Z" not in Path(f"/proc/{child.pid}/stat").read_bytes():  # dead, not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.02)
        record = reconcile(store, store.get("j"))
        assert record.status == "Failed" and "supervisor" in (record.failure_reason or "")
    finally:
        child.wait()
