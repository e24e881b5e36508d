"""Where tuning jobs live: ``<jobs home>/tuning/<name>/``, beside the job store's ``jobs/`` (whose index,
``hora job rm`` and ``hora job reindex`` never look here).

Each tuning job directory holds:

- ``config.json``: what the tuning job was asked to do (written once when it is created): the ranges, the
  strategy, the limits, the trial template (a job spec) and the estimator's fields for ``best_estimator()``;
- ``state.json``: where it stands, written only by its supervisor (atomically): status, the trials started (name,
  tuned hyperparameters, and once ended their status, objective and times), the end and a failure reason;
- ``supervisor.json`` (pid and start time of the detached supervisor) and ``supervisor.err`` (its stderr).

Its trials are ordinary jobs in the job store; ``state.json`` keeps what the tuning job needs of each, so a trial
removed with ``hora job rm`` still counts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hora.errors import ConfigError, StorageError
from hora.jobs.store import JobStore, live_supervisor, record_supervisor, write_private

__all__ = ["TERMINAL", "TuningStore"]

TERMINAL = ("Completed", "Failed", "Stopped")


class TuningStore:
    def __init__(self, store: JobStore) -> None:
        self.jobs = store
        self.root = store.home / "tuning"

    def dir(self, name: str) -> Path:
        return self.root / name

    def create(self, name: str, config: dict[str, Any]) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self.dir(name).mkdir(mode=0o700)
        except FileExistsError:
            raise ConfigError(f"a tuning job named {name!r} already exists in {self.root}; choose another name "
                              "(or leave it out for a generated one)") from None
        write_private(self.dir(name) / "config.json", json.dumps(config, indent=1))
        self.write_state(name, {"status": "InProgress", "created": config["created"], "trials": [],
                                "ended": None, "failure_reason": None, "stop_requested": False})

    def names(self) -> list[str]:
        try:
            found = [p for p in self.root.iterdir() if (p / "config.json").is_file()]
        except FileNotFoundError:
            return []
        return [p.name for p in sorted(found, key=lambda p: (p / "config.json").stat().st_mtime)]

    def _read(self, name: str, file: str) -> dict[str, Any]:
        path = self.dir(name) / file
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        except FileNotFoundError:
            raise ConfigError(f"no tuning job named {name!r} in {self.root}; `hora job tune list` shows them") from None
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot read {path}: {exc}") from None

    def config(self, name: str) -> dict[str, Any]:
        return self._read(name, "config.json")

    def state(self, name: str) -> dict[str, Any]:
        """The tuning job's state; one whose supervisor died without ending it is marked Failed."""
        state = self._read(name, "state.json")
        if state["status"] not in TERMINAL and self.supervisor_pid(name) is None and (
                (self.dir(name) / "supervisor.json").exists() or time.time() - state["created"] > 120):
            state = self._read(name, "state.json")  # it may have ended between the two reads
            if state["status"] not in TERMINAL:
                state.update(status="Failed", ended=time.time(), failure_reason=(
                    "InternalError: the tuning job's supervisor died without finishing it; see "
                    f"{self.dir(name) / 'supervisor.err'}"))
                self.write_state(name, state)
        return state

    def write_state(self, name: str, state: dict[str, Any]) -> None:
        state["modified"] = time.time()
        write_private(self.dir(name) / "state.json", json.dumps(state, indent=1))

    def trial_index(self) -> dict[str, str]:
        """trial job name -> its tuning job, for every tuning job (what the dashboard marks trials with)."""
        out: dict[str, str] = {}
        for name in self.names():
            try:
                trials = json.loads((self.dir(name) / "state.json").read_text())["trials"]
            except (OSError, ValueError, KeyError):
                continue
            out.update((t["name"], name) for t in trials)
        return out

    def record_supervisor(self, name: str, pid: int) -> None:
        record_supervisor(self.dir(name), pid)

    def supervisor_pid(self, name: str) -> int | None:
        """The supervisor's pid if that very process still runs (a zombie does not)."""
        return live_supervisor(self.dir(name))
