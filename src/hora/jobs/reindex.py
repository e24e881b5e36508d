"""``hora job reindex``: rebuild the job index (``jobs.db``) from the job directories after it was lost or damaged.

Each job directory keeps its spec (``hora/spec.json``, written when the job is created) and, once the job has
ended, its final record (``hora/record.json``). A directory is indexed again from those; where the end was never
recorded (the supervisor was killed, or the directory predates these files) the job is Failed with a reason that
says so, unless its supervisor still runs (then it stays InProgress and ends normally). The status history and
metric values of a lost index cannot be recovered: the rebuilt history says where the record came from.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from hora._proc import process_start_time
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import RECORD_FILE, SPEC_FILE, JobStore

__all__ = ["rebuild"]


def _damaged(store: JobStore) -> bool:
    if not store.db_path.exists():
        return False
    try:
        conn = sqlite3.connect(store.db_path, timeout=60.0)
        try:
            return conn.execute("PRAGMA quick_check").fetchone()[0] != "ok"
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return True


def rebuild(store: JobStore) -> tuple[list[str], Path | None]:
    """Add every job directory without a row to the index; a damaged index is first moved aside.

    Returns (the job names added, where the damaged index went or None).
    """
    moved: Path | None = None
    if _damaged(store):
        moved = store.db_path.with_name(f"jobs.db.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            old = Path(f"{store.db_path}{suffix}")
            if old.exists():
                os.replace(old, f"{moved}{suffix}")
        store = JobStore(store.home)
    added = []
    for name in store.unindexed():
        row, history = _from_directory(store, name)
        with store._db() as db:
            cols = ", ".join(row)
            db.execute(f"INSERT INTO jobs ({cols}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
            db.executemany("INSERT INTO transitions VALUES (?,?,?,?,?)", [(name, *h) for h in history])
        added.append(name)
    return added, moved


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _from_directory(store: JobStore, name: str) -> tuple[dict[str, Any], list[tuple[float, str, str, str]]]:
    job_dir = store.job_dir(name)
    hora_dir = job_dir / "hora"
    created = job_dir.stat().st_mtime
    spec = _read_json(hora_dir / SPEC_FILE)
    if spec is None:  # a directory from before spec.json: what its hosts tell
        hosts = job_dir / "hosts"
        spec = {"job_name": name, "instance_count": max(1, len(list(hosts.glob("algo-*"))) if hosts.is_dir() else 1)}
    row: dict[str, Any] = {
        "name": name,
        "job_dir": str(job_dir),
        "spec": json.dumps(spec),
        "created": created,
        "status": JobStatus.Failed.value,
        "secondary_status": SecondaryStatus.Failed.value,
    }
    note = (
        f"rebuilt by `hora job reindex` from {job_dir} "
        "(the earlier status history, metrics and system metrics were lost with the index)"
    )
    record = _read_json(hora_dir / RECORD_FILE)
    if record is not None:
        for key in ("status", "secondary_status", "created", "started", "ended", "attempts", "failure_reason",
                    "exit_code", "supervisor_pid"):
            if key in record:
                row[key] = record[key]
        row["artifacts"] = json.dumps(record.get("artifacts") or {})
        return row, [(time.time(), row["status"], row["secondary_status"], note)]
    supervisor = _read_json(hora_dir / "supervisor.json") or {}
    pid, start = int(supervisor.get("pid", 0) or 0), supervisor.get("start")
    if pid:
        row["supervisor_pid"] = pid
        row["started"] = (hora_dir / "supervisor.json").stat().st_mtime
    if pid and start and process_start_time(pid) == start:
        row["status"], row["secondary_status"] = JobStatus.InProgress.value, SecondaryStatus.Training.value
        return row, [(time.time(), row["status"], row["secondary_status"], note + "; its supervisor still runs")]
    row["ended"] = time.time()
    row["failure_reason"] = (
        f"InternalError: the job's end was never recorded in {job_dir} (its supervisor stopped before finishing, "
        "or the job predates hora/record.json); rebuilt by `hora job reindex`"
    )
    artifacts = {
        a: str(job_dir / "output" / f"{a}.tar.gz")
        for a in ("model", "output")
        if (job_dir / "output" / f"{a}.tar.gz").is_file()
    }
    row["artifacts"] = json.dumps(artifacts)
    return row, [(time.time(), row["status"], row["secondary_status"], note)]
