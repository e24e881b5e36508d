"""Where a tuning job's trials run: the trial runner its supervisor (:mod:`.tuning`) starts, follows and stops them
with.

- :class:`LocalTrials`: each trial is a hora job on this machine, with its own detached supervisor (the default);
- :class:`hora.jobs.ray_trials.RayTrials`: each trial is a Ray actor on a node of a Ray cluster that has the
  resources, running the trial as a hora job there, mirrored into this machine's job store (``ray_address``).

Either way a trial is an ordinary job of this machine's job store, which is what the tuning job reads.
"""

from __future__ import annotations

from typing import Any

from hora.jobs.api import reconcile, start_job, stop_job
from hora.jobs.spec import JobSpec
from hora.jobs.store import JobRecord, JobStore

__all__ = ["LocalTrials", "TrialRunner", "trial_runner"]


class TrialRunner:
    """Starts, follows and stops a tuning job's trials. ``start`` and ``stop`` raise :class:`~hora.errors.HoraError`
    when they cannot (a stop is tried again at the next poll)."""

    def start(self, spec: JobSpec) -> None:
        """Start the trial ``spec`` describes (recorded in the job store under ``spec.job_name`` once this returns)."""
        raise NotImplementedError

    def poll(self, name: str) -> JobRecord:
        """The trial's record as of now (its logs and metrics in the job store up to date with it)."""
        raise NotImplementedError

    def stop(self, name: str) -> None:
        """Ask the trial to stop (SIGTERM to its script, then SIGKILL after its ``stop_grace``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the runner holds (the tuning job has ended)."""


class LocalTrials(TrialRunner):
    """Trials as hora jobs on this machine, each with its own detached supervisor."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def start(self, spec: JobSpec) -> None:
        start_job(spec, self.store, wait=False)

    def poll(self, name: str) -> JobRecord:
        return reconcile(self.store, self.store.get(name))

    def stop(self, name: str) -> None:
        stop_job(self.store, name)


def trial_runner(store: JobStore, tuning_name: str, config: dict[str, Any], template: JobSpec) -> TrialRunner:
    """The runner a tuning job's config asks for: Ray's where it names a Ray cluster (``config["ray"]``)."""
    ray = config.get("ray")
    if not ray:
        return LocalTrials(store)
    from hora.jobs.ray_trials import RayTrials

    return RayTrials(store, tuning_name, template, ray["address"], ray.get("resources"))
