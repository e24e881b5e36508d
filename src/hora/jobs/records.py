"""What the processes of one attempt record for the supervisor and ``hora job describe``, in ``hora/attempt-N/``:

- ``rank-R.json`` (:class:`RankEnd`): how rank R's script ended, written by its wrapper (:mod:`hora.jobs._entry`);
- ``master.json`` (:class:`MasterRecord`): hora run's outcome on the master host, or why it could not start the
  ranks (:mod:`hora.jobs._host`);
- ``host-algo-K.json`` (:class:`HostReport`): a host that never saw the master;
- ``result.json`` (:class:`AttemptResult`): the supervisor's summary of the attempt (:mod:`hora.jobs.outcome`).

One typed record each, written whole or not at all (the supervisor may read at any moment) and read back field by
field: a record hora did not write is a ValueError that names the wrong field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hora.jobs.json_fields import Fields
from hora.runner.result import Failure, RunResult

__all__ = [
    "UNREACHABLE",
    "AttemptResult",
    "HostReport",
    "MasterRecord",
    "RankEnd",
    "attempt_dir",
    "host_says",
    "log_line",
    "stderr_line",
    "unreachable",
]


def log_line(tag: str, stream: str, text: str, now: float) -> bytes:
    """One line of a host's log, ``2026-11-22T21:40:01.123Z [algo-2 rank 3]<stderr> text`` (UTC to the
    millisecond: ``hora job logs`` and the dashboard order lines by it)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    return f"{stamp} {tag}<{stream}> {text}\n".encode(errors="replace")


def attempt_dir(job_dir: str | os.PathLike[str], attempt: int) -> Path:
    return Path(job_dir, "hora", f"attempt-{attempt}")


def _write(job_dir: str | os.PathLike[str], attempt: int, name: str, content: dict[str, Any]) -> None:
    """Write ``hora/attempt-N/<name>.json`` whole or not at all."""
    out = attempt_dir(job_dir, attempt)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{name}.tmp"
    tmp.write_text(json.dumps(content))
    os.replace(tmp, out / f"{name}.json")


def _fields(path: Path) -> Fields:
    """The record at ``path`` (OSError when there is none; ValueError when it is not JSON or not an object)."""
    return Fields(json.loads(path.read_text()), f"the record {path}")


@dataclass(frozen=True)
class RankEnd:
    """How one rank's script ended (``returncode``: negative for a signal), its stderr's last lines and when;
    ``ps_task`` names the host's TensorFlow parameter server when that ended first and the record is its."""

    rank: int
    host: str
    pid: int
    returncode: int
    tail: tuple[str, ...]
    ended: float
    ps_task: str | None = None

    @staticmethod
    def path(job_dir: str | os.PathLike[str], attempt: int, rank: int) -> Path:
        return attempt_dir(job_dir, attempt) / f"rank-{rank}.json"

    def write(self, job_dir: str | os.PathLike[str], attempt: int) -> None:
        data: dict[str, Any] = {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "returncode": self.returncode,
            "tail": list(self.tail),
            "ended": self.ended,
        }
        if self.ps_task is not None:
            data["ps_task"] = self.ps_task
        _write(job_dir, attempt, f"rank-{self.rank}", data)

    @classmethod
    def read(cls, path: Path) -> RankEnd:
        f = _fields(path)
        return cls(
            rank=f.integer("rank"),
            host=f.string("host"),
            pid=f.integer("pid"),
            returncode=f.integer("returncode"),
            tail=f.strings("tail"),
            ended=f.number("ended"),
            ps_task=f.optional_string("ps_task"),
        )

    @classmethod
    def read_all(cls, job_dir: str | os.PathLike[str], attempt: int) -> dict[int, RankEnd]:
        """Every rank's record of the attempt, by rank (ranks without one are missing)."""
        ends = (cls.read(p) for p in sorted(attempt_dir(job_dir, attempt).glob("rank-*.json")))
        return {end.rank: end for end in ends}


@dataclass(frozen=True)
class MasterRecord:
    """hora run's outcome on the master host (``result``), or ``error``: why it could not start the ranks."""

    result: RunResult | None = None
    error: str | None = None

    def write(self, job_dir: str | os.PathLike[str], attempt: int) -> None:
        if self.result is None:
            _write(job_dir, attempt, "master", {"error": self.error or "unknown"})
            return
        r = self.result
        _write(job_dir, attempt, "master", {
            "exit_code": r.exit_code,
            "returncodes": r.returncodes,
            "interrupted": r.interrupted,
            "timed_out": r.timed_out,
            "failures": [dataclasses.asdict(f) for f in r.failures],
            "job_id": r.job_id,
        })

    @classmethod
    def read(cls, job_dir: str | os.PathLike[str], attempt: int) -> MasterRecord:
        f = _fields(attempt_dir(job_dir, attempt) / "master.json")
        if f.has("error"):
            return cls(error=f.string("error"))
        failures = [_failure(item, i) for i, item in enumerate(f.items("failures"))]
        result = RunResult(
            exit_code=f.integer("exit_code"),
            returncodes=list(f.codes("returncodes")),
            failures=failures,
            interrupted=f.optional_integer("interrupted"),
            timed_out=f.boolean("timed_out"),
            job_id=f.string("job_id"),
        )
        return cls(result=result)


def _failure(data: Any, index: int) -> Failure:
    f = Fields(data, "the master's record", f"failures[{index}].")
    return Failure(
        rank=f.integer("rank"),
        host=f.string("host"),
        pid=f.integer("pid"),
        returncode=f.integer("returncode"),
        tail=list(f.strings("tail")),
        when=f.number("when"),
        stopped=f.boolean("stopped"),
        reason=f.string("reason"),
    )


@dataclass(frozen=True)
class HostReport:
    """A host other than the master that gave up: it never saw the master start the ranks (``error`` says so)."""

    host: str
    error: str

    def write(self, job_dir: str | os.PathLike[str], attempt: int) -> None:
        _write(job_dir, attempt, f"host-{self.host}", {"host": self.host, "error": self.error})

    @classmethod
    def read(cls, job_dir: str | os.PathLike[str], attempt: int, host: str) -> HostReport:
        f = _fields(attempt_dir(job_dir, attempt) / f"host-{host}.json")
        return cls(f.string("host"), f.string("error"))


@dataclass(frozen=True)
class AttemptResult:
    """The supervisor's summary of an attempt, for ``hora job describe``: each rank's exit status (None: unknown),
    the job's exit code and the signal that interrupted it, if any."""

    returncodes: tuple[int | None, ...]
    exit_code: int
    interrupted: int | None

    def write(self, job_dir: str | os.PathLike[str], attempt: int) -> None:
        data = {"returncodes": list(self.returncodes), "exit_code": self.exit_code, "interrupted": self.interrupted}
        _write(job_dir, attempt, "result", data)

    @classmethod
    def read(cls, job_dir: str | os.PathLike[str], attempt: int) -> AttemptResult:
        f = _fields(attempt_dir(job_dir, attempt) / "result.json")
        return cls(f.codes("returncodes"), f.integer("exit_code"), f.optional_integer("interrupted"))


def stderr_line(text: str) -> None:
    """One line of hora job's own on stderr; a stderr that is closed or gone is no error (the work goes on)."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


#: The exit status of an agent used in place of ssh (``SshOptions.agent``: _rsh, _srun_rsh, _ray_rsh) that could not
#: reach its host: ssh's own, which hora run reads as a lost host.
UNREACHABLE = 255


def unreachable(message: str) -> NoReturn:
    """Such an agent's end when its host cannot be reached: ``message`` on stderr, exit status 255."""
    stderr_line(f"hora job: {message}")
    os._exit(UNREACHABLE)


def host_says(host: str, message: str) -> None:
    """A message of a host's hora job process: ``[algo-2] hora job: ...`` on stderr."""
    stderr_line(f"[{host}] hora job: {message}")
