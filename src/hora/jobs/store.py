"""The job store: one SQLite database with every job's state, status history, metric values and system metrics.

It lives in the jobs home, ``~/.hora`` by default, or ``$HORA_JOB_HOME`` / ``hora job --home DIR``; each job's
files (hosts, logs, artifacts unless ``output_path`` says otherwise) live in ``<home>/jobs/<job_name>/``. Several
processes write at once (the supervisor, every rank's wrapper parsing metrics), so the database runs in WAL mode
with a generous busy timeout.

The database is an index: each job directory also keeps the job's spec (``hora/spec.json``) and, once it has ended,
its final record (``hora/record.json``), so a lost or damaged ``jobs.db`` is rebuilt from the directories by
``hora job reindex`` (:func:`hora.jobs.reindex.rebuild`). A job directory is never reused: a job whose name has a
directory but no row (the index was lost) is refused with a pointer to that command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora._proc import process_alive, process_start_time
from hora.config.variables import read
from hora.errors import ConfigError, StorageError
from hora.jobs.states import TERMINAL, JobStatus, SecondaryStatus

__all__ = ["JobRecord", "JobStore", "default_home", "live_supervisor", "record_supervisor", "write_private"]

SPEC_FILE = "spec.json"  # in <job dir>/hora/
RECORD_FILE = "record.json"


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
CREATE TABLE IF NOT EXISTS system_metrics (
    job TEXT NOT NULL, host TEXT NOT NULL, timestamp REAL NOT NULL, name TEXT NOT NULL, value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS system_metrics_job ON system_metrics (job, timestamp);
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
    def host_names(self) -> list[str]:
        """The job's hosts: ``algo-1`` .. ``algo-N``, or the real hosts of a recorded ``hora run``."""
        names = self.spec.get("host_names")
        if isinstance(names, list) and names:
            return [str(n) for n in names]
        return [f"algo-{i + 1}" for i in range(int(self.spec.get("instance_count", 1)))]

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
            # Private, as ssh keeps its files: the index and the job directories hold the specs' environment
            # values and hyperparameters.
            self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.jobs_dir.mkdir(mode=0o700, exist_ok=True)
            try:
                os.close(os.open(self.db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise self.problem(exc) from None
        try:
            conn = sqlite3.connect(self.db_path, timeout=60.0)
        except sqlite3.Error as exc:
            raise self.problem(exc) from None
        try:
            if not self._ready:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
                self._ready = True
            with conn:
                yield conn
        except sqlite3.DatabaseError as exc:
            raise self.problem(exc) from None
        finally:
            conn.close()

    def problem(self, exc: BaseException) -> StorageError:
        """What a failure of the index means, and what to do about it."""
        text = str(exc)
        if "full" in text or "disk I/O" in text or "readonly" in text or isinstance(exc, OSError):
            return _Unwritable(
                f"the job index {self.db_path} could not be written ({text}); is the disk under {self.home} full "
                "or read-only? Free space and run the command again"
            )
        return StorageError(
            f"the job index {self.db_path} is damaged ({text}); the jobs themselves are in {self.jobs_dir}: "
            f"`hora job --home {self.home} reindex` moves the damaged index aside and rebuilds it from them"
        )

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(column names, rows) of a read; on a full disk, read the database file as it is (``immutable``: no
        shared-memory file or lock needed), so the read-only commands work until space is freed."""
        try:
            with self._db() as db:
                cur = db.execute(sql, params)
                return [d[0] for d in cur.description], cur.fetchall()
        except _Unwritable:
            if not self.db_path.is_file():
                raise
        try:
            conn = sqlite3.connect(f"file:{urllib.parse.quote(str(self.db_path))}?immutable=1", uri=True)
            try:
                cur = conn.execute(sql, params)
                return [d[0] for d in cur.description], cur.fetchall()
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise self.problem(exc) from None

    def unindexed(self) -> list[str]:
        """Job directories without a row in the index (it was lost or replaced): `hora job reindex` adds them."""
        try:
            names = sorted(p.name for p in self.jobs_dir.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []
        if not names:
            return []
        known = {r[0] for r in self._query("SELECT name FROM jobs")[1]}
        return [n for n in names if n not in known]

    def lost_index_hint(self, names: list[str]) -> str:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return (
            f"{len(names)} job director{'y' if len(names) == 1 else 'ies'} in {self.jobs_dir} "
            f"{'has' if len(names) == 1 else 'have'} no entry in the job index {self.db_path} ({shown}): the index "
            f"was lost or replaced; `hora job --home {self.home} reindex` rebuilds it from the job directories"
        )

    def job_dir(self, name: str) -> Path:
        return self.jobs_dir / name

    def create(self, name: str, spec: dict[str, Any]) -> JobRecord:
        """Record a new job and make its directory; an existing job, or an existing directory, is refused."""
        now = time.time()
        with self._db() as db:
            if db.execute("SELECT 1 FROM jobs WHERE name = ?", (name,)).fetchone() is not None:
                raise ConfigError(
                    f"a job named {name!r} already exists in {self.db_path}; choose another job_name "
                    "(or leave it out for a generated one)"
                )
            try:
                self.job_dir(name).mkdir(mode=0o700)  # never reuse a directory: it holds another job's files
            except FileExistsError:
                raise ConfigError(
                    f"a job named {name!r} already has a directory, {self.job_dir(name)}, but no entry in the job "
                    f"index {self.db_path} (the index was lost or replaced); `hora job --home {self.home} reindex` "
                    "rebuilds the index from the job directories; or choose another job_name"
                ) from None
            try:
                write_private(self.job_dir(name) / "hora" / SPEC_FILE, json.dumps(spec, indent=1))
                db.execute(
                    "INSERT INTO jobs (name, status, secondary_status, job_dir, spec, created) VALUES (?,?,?,?,?,?)",
                    (
                        name,
                        JobStatus.InProgress,
                        SecondaryStatus.Starting,
                        str(self.job_dir(name)),
                        json.dumps(spec),
                        now,
                    ),
                )
                db.execute(
                    "INSERT INTO transitions VALUES (?,?,?,?,?)",
                    (name, now, JobStatus.InProgress, SecondaryStatus.Starting, "job created"),
                )
            except BaseException:
                shutil.rmtree(self.job_dir(name), ignore_errors=True)
                raise
        return self.get(name)

    def remove(self, name: str) -> None:
        """Forget job ``name``: its index entries (record, transitions, metrics, system metrics) and its directory."""
        with self._db() as db:
            for sql in ("DELETE FROM metrics WHERE job = ?", "DELETE FROM system_metrics WHERE job = ?",
                        "DELETE FROM transitions WHERE job = ?", "DELETE FROM jobs WHERE name = ?"):
                db.execute(sql, (name,))
        shutil.rmtree(self.job_dir(name), ignore_errors=True)

    def save_record(self, name: str) -> None:
        """Copy the job's final row into its directory (``hora/record.json``), for :func:`hora.jobs.reindex.rebuild`."""
        record = self.get(name)
        write_private(Path(record.job_dir) / "hora" / RECORD_FILE, json.dumps(dataclasses.asdict(record), indent=1))

    def get(self, name: str) -> JobRecord:
        cols, rows = self._query("SELECT * FROM jobs WHERE name = ?", (name,))
        row = rows[0] if rows else None
        if row is None:
            if self.job_dir(name).is_dir():
                raise ConfigError(self.lost_index_hint([name]))
            raise ConfigError(f"no job named {name!r} in {self.db_path}; `hora job list` shows the jobs there")
        return self._record(dict(zip(cols, row)))

    @staticmethod
    def _record(r: dict[str, Any]) -> JobRecord:
        return JobRecord(
            r["name"],
            JobStatus(r["status"]),
            SecondaryStatus(r["secondary_status"]),
            r["job_dir"],
            json.loads(r["spec"]),
            r["created"],
            r["started"],
            r["ended"],
            r["attempts"],
            r["failure_reason"],
            r["exit_code"],
            r["supervisor_pid"],
            bool(r["stop_requested"]),
            json.loads(r["artifacts"]),
        )

    def jobs(self) -> list[JobRecord]:
        cols, rows = self._query("SELECT * FROM jobs ORDER BY created")
        return [self._record(dict(zip(cols, r))) for r in rows]

    def update(self, name: str, **fields: Any) -> None:
        if "artifacts" in fields:
            fields["artifacts"] = json.dumps(fields["artifacts"])
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._db() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE name = ?", (*fields.values(), name))

    def transition(self, name: str, status: JobStatus, secondary: SecondaryStatus, message: str = "",
                   at: float | None = None) -> None:
        """Move the job to (status, secondary) and note it in its history, as of now or ``at`` (the time another
        store recorded it: a trial mirrored from a Ray node, :mod:`hora.jobs.trial_mirror`)."""
        now = time.time() if at is None else at
        with self._db() as db:
            db.execute("UPDATE jobs SET status = ?, secondary_status = ? WHERE name = ?", (status, secondary, name))
            db.execute("INSERT INTO transitions VALUES (?,?,?,?,?)", (name, now, status, secondary, message))

    def update_spec(self, name: str, spec: dict[str, Any]) -> None:
        """Replace the job's recorded spec (the index's copy and ``hora/spec.json``): a mirrored trial notes the
        Ray node it was placed on once Ray has placed it."""
        write_private(self.job_dir(name) / "hora" / SPEC_FILE, json.dumps(spec, indent=1))
        with self._db() as db:
            db.execute("UPDATE jobs SET spec = ? WHERE name = ?", (json.dumps(spec), name))

    def transitions(self, name: str) -> list[tuple[float, str, str, str]]:
        return [tuple(r) for r in self._query(
            "SELECT time, status, secondary_status, message FROM transitions WHERE job = ? ORDER BY rowid", (name,)
        )[1]]

    def add_metrics(self, job: str, rows: list[tuple[str, float, float, str, int, int]]) -> None:
        """rows: (name, value, timestamp, host, rank, attempt)."""
        with self._db() as db:
            db.executemany("INSERT INTO metrics VALUES (?,?,?,?,?,?,?)", [(job, *r) for r in rows])

    def metrics(self, job: str) -> list[tuple[str, float, float, str, int, int]]:
        return list(self.iter_metrics(job))

    def iter_metrics(self, job: str) -> Iterator[tuple[str, float, float, str, int, int]]:
        """The job's metric values in time order, read as they are consumed (a job may hold many)."""
        yield from self._stream(
            "SELECT name, value, timestamp, host, rank, attempt FROM metrics WHERE job = ? ORDER BY timestamp, rowid",
            (job,),
        )

    def add_system_metrics(self, job: str, rows: list[tuple[str, float, str, float]]) -> None:
        """rows: (host, timestamp, name, value) -- a batch of one host's samples (:mod:`hora.runner.system_metrics`)."""
        with self._db() as db:
            db.executemany("INSERT INTO system_metrics VALUES (?,?,?,?,?)", [(job, *r) for r in rows])

    def iter_system_metrics(self, job: str, since: float = 0.0) -> Iterator[tuple[str, float, str, float]]:
        """The job's system metric samples, (host, timestamp, name, value), in time order from ``since`` (a
        timestamp, inclusive), read as they are consumed."""
        yield from self._stream(
            "SELECT host, timestamp, name, value FROM system_metrics WHERE job = ? AND timestamp >= ? "
            "ORDER BY timestamp, rowid",
            (job, since),
        )

    def _stream(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        """The rows of a read as they are consumed; on a full disk, from the file as it is (as :meth:`_query`)."""
        try:
            with self._db() as db:
                yield from db.execute(sql, params)
            return
        except _Unwritable:  # raised while opening, before any row
            if not self.db_path.is_file():
                raise
        try:
            conn = sqlite3.connect(f"file:{urllib.parse.quote(str(self.db_path))}?immutable=1", uri=True)
            try:
                yield from conn.execute(sql, params)
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise self.problem(exc) from None

    def metrics_after(self, job: str, rowid: int, limit: int = 10_000) -> list[tuple[Any, ...]]:
        """The job's metric values stored after row ``rowid``, in the order they were stored (at most ``limit``):
        (rowid, name, value, timestamp, host, rank, attempt). A follower polls with the last rowid it saw; ``+job``
        keeps SQLite on the rowid range (the new rows), not on the job's whole index."""
        return self._query(
            "SELECT rowid, name, value, timestamp, host, rank, attempt FROM metrics WHERE rowid > ? AND +job = ? "
            "ORDER BY rowid LIMIT ?",
            (rowid, job, limit),
        )[1]

    def system_metrics_after(self, job: str, rowid: int, limit: int = 10_000) -> list[tuple[Any, ...]]:
        """The job's system metric samples stored after row ``rowid``, in the order they were stored (at most
        ``limit``): (rowid, host, timestamp, name, value); as :meth:`metrics_after`."""
        return self._query(
            "SELECT rowid, host, timestamp, name, value FROM system_metrics WHERE rowid > ? AND +job = ? "
            "ORDER BY rowid LIMIT ?",
            (rowid, job, limit),
        )[1]

    def metric_names(self, job: str) -> list[str]:
        return [str(r[0]) for r in self._query("SELECT DISTINCT name FROM metrics WHERE job = ?", (job,))[1]]


SUPERVISOR_FILE = "supervisor.json"


def record_supervisor(directory: Path, pid: int | None = None) -> None:
    """Note in ``directory/supervisor.json`` which process supervises a job, run or tuning job (this one by
    default): its pid and start time, so a later look can tell it from a process that reused the pid."""
    pid = os.getpid() if pid is None else pid
    write_private(directory / SUPERVISOR_FILE, json.dumps({"pid": pid, "start": process_start_time(pid)}))


def live_supervisor(directory: Path) -> int | None:
    """The pid :func:`record_supervisor` noted in ``directory`` if that very process still runs; None when it is
    gone, reused, or a zombie (a subreaper that has not waited for it yet still shows a dead one)."""
    try:
        info = json.loads((directory / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return None
    pid = int(info["pid"])
    return pid if info["start"] and process_alive(pid, int(info["start"])) else None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), through a temporary name: a reader never
    sees half a file, and a failed write (a full disk) leaves no partial one behind."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _Unwritable(StorageError):
    """The index cannot be written (a full or read-only disk); reads fall back to the file as it is."""
