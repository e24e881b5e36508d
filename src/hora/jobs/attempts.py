"""The attempts of a job (a mixin of :class:`hora.jobs.lifecycle.JobSupervisor`): run the script on every host,
retry it after a failure (``max_retry_attempts``: ``model/`` and ``output/`` afresh, ``checkpoints/`` kept), restart
it after a spot reclaim (:mod:`.spot`: new instances, checkpoints restored from ``checkpoint_path``, no retry used),
and sync the checkpoints out."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hora._runtime.auth import new_secret
from hora.jobs import _stage, spot
from hora.jobs.cluster import runtime_dir
from hora.jobs.host_trees import HostTrees
from hora.jobs.outcome import failure_reason, master_result
from hora.jobs.plan import JobPlan
from hora.jobs.records import AttemptResult
from hora.jobs.remote_hosts import JobLines, RemoteHosts
from hora.jobs.remote_spec import Manifest
from hora.jobs.sagemaker_env import HostLayout
from hora.jobs.spec import JobSpec
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobStore
from hora.runner.result import RunResult

__all__ = ["Attempts"]


def _timer(seconds: float, action: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()
    return timer


class Attempts:
    """What the attempts use of the supervisor is declared here; the supervisor provides it."""

    spec: JobSpec
    store: JobStore
    job_dir: Path
    hosts: list[str]
    layouts: dict[str, HostLayout]
    _trees: HostTrees
    _remote: RemoteHosts | None
    _remote_running: bool
    #: each host's checkpoints as restored from checkpoint_path or last synced out (only what differs goes out)
    _synced: dict[str, Manifest]
    echo: bool
    _reclaimed: str | None
    _limit: str | None
    _trained: float

    def say(self, message: str) -> None:
        raise NotImplementedError

    def _status(self, status: JobStatus, secondary: SecondaryStatus, message: str = "") -> None:
        raise NotImplementedError

    def _close_channels(self) -> None:
        raise NotImplementedError

    def _stage_pipes(self) -> None:
        raise NotImplementedError

    def _launch_env(self, attempt: int) -> dict[str, str]:
        raise NotImplementedError

    def _stopped_reason(self, result: RunResult | None) -> tuple[JobStatus, SecondaryStatus, str]:
        raise NotImplementedError

    def _max_run_reached(self) -> None:
        raise NotImplementedError

    def _fresh_attempt(self, new_instances: bool = False) -> None:
        """A retry starts with empty model/ and output/ and keeps checkpoints/; after a spot reclaim the hosts are
        new instances: checkpoints/ is emptied too and restored from checkpoint_path."""
        for host, layout in self.layouts.items():
            for d in (layout.model_dir, layout.output_dir) + ((layout.checkpoint_dir,) if new_instances else ()):
                shutil.rmtree(d, ignore_errors=True)
            layout.create()
            if new_instances and self.spec.checkpoint_path:
                self._synced[host] = _stage.restore_checkpoints(self.spec.checkpoint_path, layout.checkpoint_dir)
        if self._remote is not None:
            self._remote.reset(self.job_dir if new_instances else None)

    def _train(self) -> tuple[JobStatus, SecondaryStatus, str | None, int | None]:
        attempts = self.spec.max_retry_attempts + 1
        reason: str | None = None
        code: int | None = None
        failures, attempt, restored = 0, 0, False
        while True:
            attempt += 1
            self.store.update(self.spec.job_name, attempts=attempt)
            if attempt > 1:
                self._close_channels()  # the last attempt's Pipe feeders
                self._fresh_attempt(new_instances=restored)
            self._stage_pipes()
            of = f"{attempt} of {attempts}"
            if attempt > failures + 1:  # spot reclaims restarted it without using a retry
                of = f"{failures + 1} of {attempts}, attempt {attempt} in all"
            self._status(JobStatus.InProgress, SecondaryStatus.Training,
                         f"attempt {of}: {self.spec.world_size} rank(s) with hora run")
            result = self._run_attempt(attempt)
            self._sync_checkpoints_out()
            if self._reclaimed is not None and self._limit is None:
                self._wait_for_capacity(self._reclaimed)
                self._reclaimed, restored = None, True
                continue
            if result.interrupted is not None:
                status, secondary, why = self._stopped_reason(result)
                return status, secondary, why, result.exit_code
            if result.exit_code == 0:
                return JobStatus.Completed, SecondaryStatus.Completed, None, 0
            reason, code = failure_reason(self.job_dir, self.hosts, self.spec.processes_per_host, attempt, result)
            failures, restored = failures + 1, False
            if failures >= attempts:
                return JobStatus.Failed, SecondaryStatus.Failed, reason, code
            self.say(f"attempt {attempt} failed; retrying. {reason.splitlines()[0]}")

    def _wait_for_capacity(self, host: str) -> None:
        """After a spot reclaim: Interrupted while "capacity" comes back, then Restarting (spot.py)."""
        self._status(JobStatus.InProgress, SecondaryStatus.Interrupted,
                     f"spot capacity reclaimed ({host}); checkpoints synced out; waiting for capacity")
        time.sleep(spot.CAPACITY_WAIT)  # a stop or max_wait meanwhile raises _Stop (the signal handler)
        self._status(JobStatus.InProgress, SecondaryStatus.Restarting,
                     "restarting on new instances from the synced checkpoints")

    def _run_attempt(self, attempt: int) -> RunResult:
        """Start every host's process tree for ``attempt`` and read back hora run's outcome."""
        (self.job_dir / "hora" / f"attempt-{attempt}").mkdir(parents=True, exist_ok=True)
        secret = self.job_dir / "hora" / "secret"
        secret.touch(mode=0o600)
        secret.write_text(new_secret().hex())  # a fresh secret per attempt: an old attempt's process cannot join
        runtime_dir(self.job_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        limit = sync = None
        if self.spec.use_spot_instances:  # max_run bounds the time trained; checkpoints go out while it runs
            limit = _timer(max(self.spec.max_run - self._trained, 0.0), self._max_run_reached)
            if self.spec.checkpoint_path:
                sync = spot.CheckpointSync(self._sync_running_checkpoints_out, self.say)
        began = time.monotonic()
        try:
            if self._remote is not None:
                return self._run_remote(attempt)
            codes = self._trees.run(attempt, self._launch_env(attempt))
        finally:
            self._trained += time.monotonic() - began
            if limit is not None:
                limit.cancel()
            if sync is not None:
                sync.close()
        return master_result(
            self.job_dir, self.hosts, self.spec.world_size, attempt, codes, self._trees.interrupted
        )

    def _run_remote(self, attempt: int) -> RunResult:
        """The attempt on the real hosts: hora run's launch() from here, over SSH; then every host's results home,
        whatever the outcome."""
        from hora.jobs.parameter_server import launch_settings
        from hora.runner.hosts import HostSlots
        from hora.runner.launch import LaunchSpec, launch

        assert self._remote is not None
        plan = JobPlan.read(self.job_dir)
        settings = launch_settings(plan)
        lines = JobLines(self.job_dir, plan.metric_definitions, str(self.store.home), self.spec.job_name, attempt)
        spec = LaunchSpec(
            self._remote.command(plan.processes_per_host), plan.world_size, env=self._launch_env(attempt),
            settings=settings, prefix_output=False, grace=plan.grace, cwd="/",
            hosts=[HostSlots(h, plan.processes_per_host) for h in self._remote.hosts], ssh=self._remote.ssh,
            host_addresses=self._remote.addresses, observer=lines, quiet=not self.echo,
            remote_only=self._remote.cluster.slurm,
        )
        self._remote_running = True  # a spot reclaim now stops the launch (lifecycle._on_signal)
        try:
            result = launch(spec)
        finally:
            self._remote_running = False
            lines.close()
            self._remote.pull(self.job_dir, attempt)
        AttemptResult(tuple(result.returncodes), result.exit_code, result.interrupted).write(self.job_dir, attempt)
        return result

    def _sync_running_checkpoints_out(self) -> None:
        """While an attempt runs: on remote hosts the checkpoints come home first (the sync uploads the local
        trees)."""
        if self._remote is not None:
            self._remote.pull(self.job_dir, None)
        self._sync_checkpoints_out()

    def _sync_checkpoints_out(self) -> None:
        if self.spec.checkpoint_path:
            for host, layout in self.layouts.items():
                self._synced[host] = _stage.upload_changed(layout.checkpoint_dir, self.spec.checkpoint_path,
                                                           self._synced.get(host, {}))
