"""``hora run --record``: a run of ``hora run`` kept in the job store beside the jobs.

The run gets a store entry named ``run-<UTC time>-<4 hex>`` (kind ``run``), so ``hora dashboard`` and ``hora job
list / describe / logs / stop`` show it as they show a job: its command (as the entry point), its hosts and
ranks, every line of every rank in ``logs/<host>.log`` in the job log format (``<UTC time> [host rank 3]<stderr>
text``; the stall inspector's warnings are rank 0's lines), and, when it fails, the root-cause report as its failure
reason. The launcher is the run's supervisor: ``hora job stop`` sends it SIGTERM, and a launcher that was killed is
found dead and the run marked Failed, as for a job. Nothing is parsed for metrics (a run has no
``metric_definitions``).

A run that cannot be recorded (a full disk, a damaged index) is not stopped for it: the recorder says why once, on
the launcher's stderr, and records nothing more.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from hora.errors import HoraError
from hora.jobs.records import log_line
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobStore, record_supervisor, write_private

__all__ = ["RunRecorder"]


class RunRecorder:
    """A :class:`hora.runner.observer.RunObserver` writing the run into ``store`` (see the module docstring)."""

    def __init__(self, store: JobStore, command: Sequence[str], np: int | None) -> None:
        self.store = store
        self.name = f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
        self._failed = False
        self._lock = threading.Lock()
        self._host_of: dict[str, str] = {}
        self._logs: dict[str, int] = {}
        self._job_log: IO[str] | None = None
        self._spec = {"kind": "run", "entry_point": shlex.join(command), "instance_count": 1,
                      "processes_per_host": np or 1, "hyperparameters": {}, "environment": {}}
        self._guard(self._create)

    def _create(self) -> None:
        record = self.store.create(self.name, self._spec)
        self.dir = Path(record.job_dir)
        (self.dir / "logs").mkdir(mode=0o700, exist_ok=True)
        self._job_log = open(self.dir / "logs" / "job.log", "a", opener=_private)  # noqa: SIM115 - closed in ended
        record_supervisor(self.dir / "hora")
        self.store.update(self.name, started=time.time(), supervisor_pid=os.getpid(), attempts=1)
        self._note(f"hora run {self._spec['entry_point']}")

    def started(self, ranks: Sequence[tuple[int, str]]) -> None:
        def record() -> None:
            hosts = list(dict.fromkeys(host for _, host in ranks))
            self._host_of = {str(rank): host for rank, host in ranks}
            per_host = max(sum(1 for _, h in ranks if h == host) for host in hosts) if hosts else 1
            spec = {**self._spec, "instance_count": len(hosts), "processes_per_host": per_host, "host_names": hosts,
                    "ranks": [[rank, host] for rank, host in ranks]}
            self.store.update(self.name, spec=json.dumps(spec))
            write_private(self.dir / "hora" / "spec.json", json.dumps(spec, indent=1))
            for host in hosts:
                self._logs[host] = os.open(self.dir / "logs" / f"{host}.log",
                                           os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self.store.transition(self.name, JobStatus.InProgress, SecondaryStatus.Training,
                                  f"{len(ranks)} rank(s) on {', '.join(hosts)}")
            self._note(f"InProgress / Training: {len(ranks)} rank(s) on {', '.join(hosts)}")

        self._guard(record)

    def line(self, label: str, stream: str, text: str) -> None:
        if self._failed or not self._logs:
            return
        host = self._host_of.get(label) or next(iter(self._logs))
        tag = f"[{host} rank {label}]" if label.isdigit() else f"[{host} {label}]"
        line = log_line(tag, stream, text, time.time())
        self._guard(lambda: os.write(self._logs[host], line))

    def ended(self, exit_code: int, report: str) -> None:
        def record() -> None:
            stopped = self.store.get(self.name).stop_requested
            status = JobStatus.Completed if exit_code == 0 else JobStatus.Stopped if stopped else JobStatus.Failed
            secondary = SecondaryStatus(status.value)
            self.store.update(self.name, ended=time.time(), exit_code=exit_code,
                              failure_reason=(report or f"exit code {exit_code}") if exit_code else None)
            message = "" if exit_code == 0 else f"exit code {exit_code}"
            self.store.transition(self.name, status, secondary, message)
            self._note(f"{status} / {secondary}" + (f": {message}" if message else ""))
            self.store.save_record(self.name)

        self._guard(record)
        with self._lock:
            for fd in self._logs.values():
                os.close(fd)
            self._logs = {}
            if self._job_log is not None:
                self._job_log.close()
                self._job_log = None

    def _note(self, text: str) -> None:
        if self._job_log is not None:  # one line per note: a command's newlines are written as \n
            self._job_log.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + text.replace("\n", "\\n") + "\n")
            self._job_log.flush()

    def _guard(self, action: object) -> None:
        """Run ``action``; the first failure is said once and ends the recording (the run goes on)."""
        if self._failed:
            return
        try:
            with self._lock:
                action()  # type: ignore[operator]
        except (OSError, HoraError) as exc:
            self._failed = True
            print(f"hora run: --record stopped recording this run in {self.store.home}: {exc}", file=sys.stderr)


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)
