"""Mirroring a job that runs in another job store (a Ray node's, :mod:`.ray_trials`) into this machine's, so it is an
ordinary job here too: ``hora job list / describe / logs / metrics`` and the tuning job read it as they read a local
one.

Two halves, both plain functions of two job stores, so they are tested without Ray:

- :func:`node_answer` runs where the job runs: from a cursor (how far the mirror has read), what is new: the
  record's fields, its status history, the bytes appended to its log files, its metric rows and system metric
  samples;
- :class:`TrialMirror` runs here: it applies an answer to the job's record in this store and keeps the cursor.

The mirror never shows an end before it has everything: an answer is ``final`` only once the job's supervisor
process has exited (everything it wrote is there), and the logs and metrics are drained; until then a terminal
status is held back, so whoever sees the mirrored job ended (the tuning job reading its objective) sees all of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hora.errors import StorageError
from hora.jobs.states import TERMINAL, JobStatus, SecondaryStatus
from hora.jobs.store import JobStore

__all__ = ["LOG_CHUNK", "METRIC_ROWS", "TrialMirror", "new_cursor", "node_answer"]

#: The most bytes of one log file, and metric rows, one answer carries (the rest comes with the next).
LOG_CHUNK = 1 << 20
METRIC_ROWS = 10_000


def new_cursor() -> dict[str, Any]:
    """Nothing read yet; the node's first transition ("job created") is skipped: the mirror has its own."""
    return {"logs": {}, "metrics": 0, "system_metrics": 0, "transitions": 1}


def node_answer(store: JobStore, name: str, cursor: dict[str, Any], exited: bool) -> dict[str, Any]:
    """What is new about job ``name`` of ``store`` since ``cursor`` (see the module's docstring).

    Args:
        exited: whether the job's supervisor process has ended, taken before this call: only then may the answer
            be final.
    """
    steps = store.transitions(name)[int(cursor["transitions"]):]
    record = store.get(name)
    offsets = dict(cursor["logs"])
    logs: dict[str, bytes] = {}
    drained = True
    log_dir = Path(record.job_dir) / "logs"
    for path in sorted(log_dir.iterdir()) if log_dir.is_dir() else []:
        if not path.is_file():
            continue
        start = int(offsets.get(path.name, 0))
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(LOG_CHUNK + 1)
        if len(data) > LOG_CHUNK:
            data, drained = data[:LOG_CHUNK], False
        if data:
            logs[path.name] = data
            offsets[path.name] = start + len(data)
    rows = store.metrics_after(name, int(cursor["metrics"]), METRIC_ROWS)
    samples = store.system_metrics_after(name, int(cursor.get("system_metrics", 0)), METRIC_ROWS)
    drained = drained and len(rows) < METRIC_ROWS and len(samples) < METRIC_ROWS
    final = exited and record.done and drained
    if not final:  # hold back the end (and what follows it) until everything before it is mirrored
        for i, step in enumerate(steps):
            if step[1] in TERMINAL:
                steps = steps[:i]
                break
    fields: dict[str, Any] = {"started": record.started, "attempts": record.attempts}
    if final:
        fields.update(ended=record.ended, failure_reason=record.failure_reason, exit_code=record.exit_code,
                      artifacts=record.artifacts)
    return {
        "record": fields,
        "transitions": [list(s) for s in steps],
        "logs": logs,
        "metrics": [tuple(r[1:]) for r in rows],
        "system_metrics": [tuple(r[1:]) for r in samples],
        "final": final,
        "cursor": {"logs": offsets, "metrics": rows[-1][0] if rows else cursor["metrics"],
                   "system_metrics": samples[-1][0] if samples else cursor.get("system_metrics", 0),
                   "transitions": int(cursor["transitions"]) + len(steps)},
    }


class TrialMirror:
    """The mirrored job ``name`` of ``store`` (recorded already: :meth:`JobStore.create`) and how far it has read."""

    def __init__(self, store: JobStore, name: str) -> None:
        self.store, self.name = store, name
        self.cursor = new_cursor()
        self.done = False

    def apply(self, answer: dict[str, Any], artifacts: dict[str, str] | None = None) -> None:
        """Write what :func:`node_answer` found into this store: log bytes, metric rows, the record's fields, then
        the status history (the end last). ``artifacts``: where the job's artifacts are now (they were brought
        home), in place of the node's."""
        if self.done:
            return
        log_dir = self.store.job_dir(self.name) / "logs"
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for file, data in answer["logs"].items():
            if os.sep in file or file.startswith("."):
                raise StorageError(f"a mirrored log file is named {file!r}: not a file of a job's logs/")
            fd = os.open(log_dir / file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as f:
                f.write(data)
        if answer["metrics"]:
            self.store.add_metrics(self.name, [tuple(r) for r in answer["metrics"]])
        if answer.get("system_metrics"):
            self.store.add_system_metrics(self.name, [tuple(r) for r in answer["system_metrics"]])
        fields = dict(answer["record"])
        if artifacts is not None:
            fields["artifacts"] = artifacts
        self.store.update(self.name, **fields)
        for at, status, secondary, message in answer["transitions"]:
            self.store.transition(self.name, JobStatus(status), SecondaryStatus(secondary), message, at=at)
        self.cursor = answer["cursor"]
        if answer["final"]:
            self.done = True
            self.store.save_record(self.name)
