"""The job store: one SQLite database with every job's state, status history and metric values.

It lives in the jobs home, ``~/.hora`` by default, or ``$HORA_JOB_HOME`` / ``hora job --home DIR``; each job's
files (hosts, logs, artifacts unless ``output_path`` says otherwise) live in ``<home>/jobs/<job_name>/``. Several
processes write at once (the supervisor, every rank's wrapper parsing metrics), so the database runs in WAL mode
with a generous busy timeout.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora.config.variables import read
from hora.errors import ConfigError
from hora.jobs.states import TERMINAL, JobStatus, SecondaryStatus

__all__ = ["JobRecord", "JobStore", "default_home"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    secondary_status TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    spec TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    failure_reason TEXT,
    exit_code INTEGER,
    supervisor_pid INTEGER,
    stop_requested INTEGER NOT NULL DEFAULT 0,
    artifacts TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS transitions (
    job TEXT NOT NULL, time REAL NOT NULL, status TEXT NOT NULL, secondary_status TEXT NOT NULL, message TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, timestamp REAL NOT NULL,
    host TEXT NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_job ON metrics (job, name, timestamp);
"""


def default_home() -> Path:
    home = read("HORA_JOB_HOME")
    return Path(home).expanduser() if home else Path.home() / ".hora"


@dataclass
class JobRecord:
    name: str
    status: JobStatus
    secondary_status: SecondaryStatus
    job_dir: str
    spec: dict[str, Any]
    created: float
    started: float | None
    ended: float | None
    attempts: int
    failure_reason: str | None
    exit_code: int | None
    supervisor_pid: int | None
    stop_requested: bool
    artifacts: dict[str, str]

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started


class JobStore:
    """A handle on the jobs home; cheap to create, opens a connection per operation (safe across forks)."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.home = Path(home).expanduser() if home else default_home()
        self.db_path = self.home / "jobs.db"
        self.jobs_dir = self.home / "jobs"
        self._ready = False

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.db_path, timeout=60.0)
        try:
            if not self._ready:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
                self._ready = True
            with conn:
                yield conn
        finally:
            conn.close()

    def job_dir(self, name: str) -> Path:
        return self.jobs_dir / name

    def create(self, name: str, spec: dict[str, Any]) -> JobRecord:
        now = time.time()
        with self._db() as db:
            try:
                db.execute(
                    "INSERT INTO jobs (name, status, secondary_status, job_dir, spec, created) VALUES (?,?,?,?,?,?)",
                    (name, JobStatus.InProgress, SecondaryStatus.Starting, str(self.job_dir(name)), json.dumps(spec), now),
                )
            except sqlite3.IntegrityError:
                raise ConfigError(
                    f"a job named {name!r} already exists in {self.db_path}; choose another job_name "
                    "(or leave it out for a generated one)"
                ) from None
            db.execute("INSERT INTO transitions VALUES (?,?,?,?,?)", (name, now, JobStatus.InProgress, SecondaryStatus.Starting, "job created"))
        return self.get(name)

    def get(self, name: str) -> JobRecord:
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE name = ?", (name,)).fetchone()
            cols = [d[0] for d in db.execute("SELECT * FROM jobs LIMIT 0").description]
        if row is None:
            raise ConfigError(f"no job named {name!r} in {self.db_path}; `hora job list` shows the jobs there")
        return self._record(dict(zip(cols, row)))

    @staticmethod
    def _record(r: dict[str, Any]) -> JobRecord:
        return JobRecord(
            r["name"], JobStatus(r["status"]), SecondaryStatus(r["secondary_status"]), r["job_dir"], json.loads(r["spec"]), r["created"],
            r["started"], r["ended"], r["attempts"], r["failure_reason"], r["exit_code"], r["supervisor_pid"],
            bool(r["stop_requested"]), json.loads(r["artifacts"]),
        )

    def jobs(self) -> list[JobRecord]:
        with self._db() as db:
            cur = db.execute("SELECT * FROM jobs ORDER BY created")
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
        return [self._record(dict(zip(cols, r))) for r in rows]

    def update(self, name: str, **fields: Any) -> None:
        if "artifacts" in fields:
            fields["artifacts"] = json.dumps(fields["artifacts"])
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._db() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE name = ?", (*fields.values(), name))

    def transition(self, name: str, status: JobStatus, secondary: SecondaryStatus, message: str = "") -> None:
        now = time.time()
        with self._db() as db:
            db.execute("UPDATE jobs SET status = ?, secondary_status = ? WHERE name = ?", (status, secondary, name))
            db.execute("INSERT INTO transitions VALUES (?,?,?,?,?)", (name, now, status, secondary, message))

    def transitions(self, name: str) -> list[tuple[float, str, str, str]]:
        with self._db() as db:
            return [tuple(r) for r in db.execute(
                "SELECT time, status, secondary_status, message FROM transitions WHERE job = ? ORDER BY rowid", (name,)
            )]

    def add_metrics(self, job: str, rows: list[tuple[str, float, float, str, int, int]]) -> None:
        """rows: (name, value, timestamp, host, rank, attempt)."""
        with self._db() as db:
            db.executemany("INSERT INTO metrics VALUES (?,?,?,?,?,?,?)", [(job, *r) for r in rows])

    def metrics(self, job: str) -> list[tuple[str, float, float, str, int, int]]:
        with self._db() as db:
            return [tuple(r) for r in db.execute(
                "SELECT name, value, timestamp, host, rank, attempt FROM metrics WHERE job = ? ORDER BY timestamp, rowid",
                (job,),
            )]
