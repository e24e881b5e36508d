"""Running a tuning job: its detached supervisor starts the trials (ordinary hora jobs), at most
``max_parallel_jobs`` at once, tells the strategy how each ended (and first, for a warm start, how the parents'
trials did), stops a trial early under the median rule or at a Hyperband rung, ends the tuning job early when its
completion criteria are met, and records everything in the tuning job's ``state.json`` (:mod:`.tuning_store`).

:func:`start_tuning_job` records a tuning job and starts its supervisor (``python -m hora.jobs._tuning_supervisor
HOME NAME``) detached from the caller, so it survives the caller's exit and any process can follow it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from hora._proc import handle_signals
from hora.errors import ConfigError, HoraError, TimeoutError
from hora.jobs.completion import CompletionCriteria, converged, not_improving
from hora.jobs.hyperband import Hyperband
from hora.jobs.parameter import ranges_from_dict
from hora.jobs.search import SearchStrategy, make_search, median_stop
from hora.jobs.spec import spec_from_dict
from hora.jobs.store import JobStore
from hora.jobs.trials import LocalTrials, TrialRunner, trial_runner
from hora.jobs.tuning_store import TERMINAL, TuningStore
from hora.jobs.warm_start import parent_trials

__all__ = ["TuningSupervisor", "objective_series", "start_tuning_job", "stop_tuning_job", "wait_tuning_job"]


def start_tuning_job(tstore: TuningStore, name: str, config: dict[str, Any]) -> None:
    """Record the tuning job and start its supervisor in a process of its own (see :func:`hora.jobs.start_job`)."""
    tstore.create(name, config)
    code = (
        "import subprocess, sys;"
        "subprocess.Popen([sys.executable, '-m', 'hora.jobs._tuning_supervisor', sys.argv[1], sys.argv[2]],"
        " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
        " stderr=open(sys.argv[3], 'ab'), close_fds=True)"
    )
    log = tstore.dir(name) / "supervisor.err"
    home = str(tstore.jobs.home.resolve())  # the trials run with another working directory
    subprocess.run([sys.executable, "-c", code, home, name, str(log)], check=True, timeout=60)


def stop_tuning_job(tstore: TuningStore, name: str) -> dict[str, Any]:
    """Ask the tuning job to stop: its running trials are stopped (SIGTERM to their scripts), it starts no more,
    and it ends Stopped. Returns its state."""
    state = tstore.state(name)
    if state["status"] in TERMINAL:
        return state
    pid = tstore.supervisor_pid(name)
    if pid is None:
        raise ConfigError(f"tuning job {name!r} has no supervisor yet; try again in a moment")
    os.kill(pid, signal.SIGTERM)
    return state


def wait_tuning_job(tstore: TuningStore, name: str, timeout: float | None = None,
                    poll: float = 0.5) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = tstore.state(name)
        if state["status"] in TERMINAL:
            return state
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"tuning job {name!r} is still {state['status']} after {timeout:g}s")
        time.sleep(poll)


def objective_series(store: JobStore, job: str, metric: str) -> list[float]:
    """The objective's values of a trial in time order, as one rank printed them (the first that did): every rank
    of a distributed job may print the same line."""
    first: tuple[str, int, int] | None = None
    out = []
    for name, value, _ts, host, rank, attempt in store.iter_metrics(job):
        if name != metric:
            continue
        first = first or (host, rank, attempt)
        if (host, rank, attempt) == first:
            out.append(value)
        elif attempt > first[2]:  # a retried job: its series starts again
            first, out = (host, rank, attempt), [value]
    return out


class TuningSupervisor:
    """Runs one tuning job to its end (in the detached supervisor process)."""

    def __init__(self, tstore: TuningStore, name: str, poll: float = 0.5) -> None:
        self.tstore, self.store, self.name, self.poll = tstore, tstore.jobs, name, poll
        self.config = tstore.config(name)
        self.state = tstore.state(name)
        cfg = self.config["HyperParameterTuningJobConfig"]
        self.metric = cfg["HyperParameterTuningJobObjective"]["MetricName"]
        self.maximize = cfg["HyperParameterTuningJobObjective"]["Type"] == "Maximize"
        limits = cfg["ResourceLimits"]
        self.max_jobs = int(limits["MaxNumberOfTrainingJobs"])
        self.max_parallel = int(limits["MaxParallelTrainingJobs"])
        self.max_runtime = limits.get("MaxRuntimeInSeconds")
        self.early = cfg.get("TrainingJobEarlyStoppingType", "Off") == "Auto"
        self.search: SearchStrategy = make_search(cfg["Strategy"], ranges_from_dict(cfg["ParameterRanges"]),
                                                  self.maximize, cfg.get("RandomSeed"), self.max_jobs)
        self.template = spec_from_dict(self.config["template"])
        hb = self.config.get("hyperband")
        self.hyperband = None if hb is None else Hyperband(hb["min_resource"], hb["max_resource"])
        self.criteria = CompletionCriteria.from_request(cfg.get("TuningJobCompletionCriteria"))
        self._stop_reason: str | None = None
        self._complete_reason: str | None = None
        self._tokens: dict[str, int] = {}
        self.runner: TrialRunner = LocalTrials(self.store)  # run() puts the config's own in place (.trials)
        self._warm_start()

    def _warm_start(self) -> None:
        """Tell the strategy the parents' trials before its first suggestion (once: not again on a restart)."""
        warm = self.config.get("WarmStartConfig")
        if warm is None:
            return
        parents = [p["HyperParameterTuningJobName"] for p in warm["ParentHyperParameterTuningJobs"]]
        trials = parent_trials(self.tstore, parents)
        told = self.search.warm([(t["hyperparameters"], t["objective"], t["status"]) for t in trials])
        self.state["warm_start"] = {"parent_trials": len(trials), "told": told}

    def _signal(self, signum: int, _frame: Any) -> None:
        self._stop_reason = self._stop_reason or "stopped by request"

    def run(self) -> None:
        with handle_signals(self._signal, signal.SIGTERM, signal.SIGINT):
            try:
                self.runner = trial_runner(self.store, self.name, self.config, self.template)
            except HoraError as exc:  # e.g. no Ray cluster there, or no node of it can take a trial
                self._end("Failed", str(exc))
                return
            try:
                self._loop()
            except Exception as exc:  # recorded, and no trial is left running without its tuning job
                self._stop_running()
                self._end("Failed", f"InternalError: the tuning job's supervisor failed: {type(exc).__name__}: {exc}")
                raise
            finally:
                self.runner.close()

    def _trials(self, status: str | None = None) -> list[dict[str, Any]]:
        return [t for t in self.state["trials"] if status is None or t["status"] == status]

    def _loop(self) -> None:
        started_at = self.state["created"]
        while True:
            if self.max_runtime is not None and time.time() - started_at > float(self.max_runtime):
                self._stop_reason = self._stop_reason or f"MaxRuntimeInSeconds ({self.max_runtime}) was reached"
            if self._stop_reason is not None:
                self.state["status"] = "Stopping"
                self._stop_running()
            elif self._complete_reason is not None:  # SageMaker stops the trials still running
                self._stop_running(f"stopped: the tuning job is complete ({self._complete_reason})")
            for trial in self._trials("InProgress"):
                self._follow(trial)
            self._check_completion()
            if self._stop_reason is None and self._complete_reason is None:
                while len(self._trials("InProgress")) < self.max_parallel and len(self._trials()) < self.max_jobs:
                    if not self._launch():
                        self.max_jobs = len(self._trials())  # the strategy has no more (a Grid is done)
                        break
            if not self._trials("InProgress") and (self._stop_reason is not None or self._complete_reason is not None
                                                  or len(self._trials()) >= self.max_jobs):
                if self._stop_reason is None or self._complete_reason is not None:
                    self._end("Completed", None)
                else:
                    self._end("Stopped", self._stop_reason)
                return
            self.tstore.write_state(self.name, self.state)
            time.sleep(self.poll)

    def _launch(self) -> bool:
        suggestion = self.search.suggest()
        if suggestion is None:
            return False
        token, tuned = suggestion
        index = len(self._trials()) + 1
        job = f"{self.name}-{index:03d}-{uuid.uuid4().hex[:8]}"
        trial: dict[str, Any] = {"name": job, "tuned": tuned, "created": time.time(), "status": "InProgress",
                                 "objective": None, "started": None, "ended": None, "failure_reason": None,
                                 "epochs_checked": 0}
        if self.hyperband is not None:
            trial["bracket"] = self.hyperband.bracket(index - 1)
        self.state["trials"].append(trial)
        self._tokens[job] = token
        self.tstore.write_state(self.name, self.state)  # named as a trial before it shows as a job
        spec = dataclasses.replace(self.template, job_name=job,
                                   hyperparameters={**self.template.hyperparameters, **tuned})
        try:
            self.runner.start(spec)
        except HoraError as exc:  # counted as a failed trial, as the service counts one that cannot start
            self._finish(trial, "Failed", None, f"the trial could not start: {exc}")
        self.tstore.write_state(self.name, self.state)
        return True

    def _follow(self, trial: dict[str, Any]) -> None:
        record = self.runner.poll(trial["name"])
        trial["started"] = record.started
        series = objective_series(self.store, trial["name"], self.metric)
        if ((self.early or self.hyperband is not None) and not record.done and self._stop_reason is None
                and not trial.get("stop_sent")):
            peers = self._peers(trial)
            for k in range(trial["epochs_checked"] + 1, len(series) + 1):
                reason = self._judge(trial, series[:k], peers)
                trial["epochs_checked"] = k
                if reason is not None:
                    try:
                        self.runner.stop(trial["name"])
                    except HoraError:  # its supervisor is not up yet: judge this epoch again next round
                        trial["epochs_checked"] = k - 1
                        break
                    trial["early_stop_reason"], trial["stop_sent"] = reason, True
                    break
        trial["series"] = series
        if record.done:
            status = str(record.status)
            value = series[-1] if series and status != "Failed" else None
            reason = trial.get("early_stop_reason") or record.failure_reason
            trial["started"], trial["ended"] = record.started, record.ended
            self._finish(trial, status, value, reason)

    def _peers(self, trial: dict[str, Any]) -> list[list[float]]:
        """The series a trial is judged against: the median rule's earlier trials, or the other trials of its
        Hyperband bracket."""
        if self.hyperband is not None:
            return [t.get("series") or [] for t in self._trials()
                    if t is not trial and t.get("bracket") == trial.get("bracket")]
        return [t.get("series") or [] for t in self._trials() if t["created"] < trial["created"]]

    def _judge(self, trial: dict[str, Any], series: list[float], peers: list[list[float]]) -> str | None:
        if self.hyperband is not None:
            return self.hyperband.judge(int(trial.get("bracket", 0)), series, peers, self.maximize)
        return median_stop(series, peers, self.maximize)

    def _check_completion(self) -> None:
        """Record TuningJobCompletionDetails and note when a completion criterion is met (the loop then stops the
        running trials, starts no more and ends Completed)."""
        if self.criteria is None or self._complete_reason is not None:
            return
        ended = sorted((t for t in self._trials() if t["status"] != "InProgress" and t["objective"] is not None),
                       key=lambda t: t["ended"])
        values = [float(t["objective"]) for t in ended]
        self.state["not_improving"] = not_improving(values, self.maximize)
        if self.state.get("convergence_detected") is None and converged(values, self.maximize):
            self.state["convergence_detected"] = time.time()
        self._complete_reason = self.criteria.met(values, self.maximize)
        if self._complete_reason is not None:
            self.state["completion_reason"] = self._complete_reason

    def _finish(self, trial: dict[str, Any], status: str, value: float | None, reason: str | None) -> None:
        trial.update(status=status, objective=value, failure_reason=reason)
        trial["ended"] = trial["ended"] or time.time()
        self.search.observe(self._tokens.pop(trial["name"], -1), value, status)

    def _stop_running(self, reason: str | None = None) -> None:
        for trial in self._trials("InProgress"):
            if trial.get("stop_sent"):
                continue
            try:
                self.runner.stop(trial["name"])
                trial["stop_sent"] = True
                if reason is not None:
                    trial["early_stop_reason"] = reason
            except HoraError:  # no supervisor yet: the next round tries again
                pass

    def _end(self, status: str, reason: str | None) -> None:
        self.state.update(status=status, ended=time.time(), failure_reason=reason)
        self.tstore.write_state(self.name, self.state)
