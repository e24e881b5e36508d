"""Starting, waiting for and stopping jobs: what ``hora job`` and :class:`Estimator` call."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hora.errors import ConfigError, StorageError, TimeoutError
from hora.jobs.cluster import runtime_dir
from hora.jobs.lifecycle import JobSupervisor
from hora.jobs.spec import JobSpec
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobRecord, JobStore, live_supervisor

__all__ = ["reconcile", "start_job", "stop_job", "wait_job"]


def start_job(spec: JobSpec, store: JobStore | None = None, wait: bool = True, echo: bool = True,
              progress: Callable[[str], None] | None = None) -> JobRecord:
    """Record the job and run it: here until it ends (``wait=True``), or in a detached supervisor process that
    outlives this one (``wait=False``; follow it with ``hora job logs --follow``)."""
    store = store or JobStore()
    if spec.cluster is not None and spec.cluster.slurm and not spec.cluster.hosts:  # the allocation's nodes
        import dataclasses

        from hora.config.variables import environment
        from hora.jobs.slurm_hosts import allocation_cluster

        spec = dataclasses.replace(spec, cluster=allocation_cluster(spec.cluster, environment(), spec.instance_count))
    store.create(spec.job_name, spec.to_dict())
    if wait and threading.current_thread() is threading.main_thread():
        return JobSupervisor(spec, store, echo=echo, progress=progress).run()
    # Off the main thread this process cannot take the signals that carry max_run and `hora job stop` to the
    # ranks, so the job gets its own supervisor process; waiting for it then means following the store.
    # Detach through a short-lived middle process, so the supervisor is nobody's child here (no zombie, no
    # process left behind by whoever called us) and survives this process.
    code = (
        "import os, subprocess, sys;"
        "subprocess.Popen([sys.executable, '-m', 'hora.jobs._supervisor', sys.argv[1], sys.argv[2]],"
        " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
        " stderr=open(sys.argv[3], 'ab'), close_fds=True)"
    )
    log = store.job_dir(spec.job_name) / "logs" / "supervisor.err"
    log.parent.mkdir(parents=True, exist_ok=True)
    # The home as an absolute path: the supervisor (and the ranks it starts) run in other working directories.
    home = str(store.home.resolve())
    subprocess.run([sys.executable, "-c", code, home, spec.job_name, str(log)], check=True, timeout=60)
    if wait:
        return wait_job(store, spec.job_name)
    return store.get(spec.job_name)


def reconcile(store: JobStore, record: JobRecord) -> JobRecord:
    """A job whose supervisor died (SIGKILL, a crash, a reboot) without ending it is marked Failed, so nobody
    waits for it forever."""
    if record.done or record.supervisor_pid is None or _supervisor_alive(record) is not None:
        return record
    fresh = store.get(record.name)  # it may have ended between the two reads
    if fresh.done:
        return fresh
    try:
        store.update(record.name, ended=time.time(), failure_reason=(
            f"InternalError: the job's supervisor (pid {record.supervisor_pid}) died without finishing the job; "
            "its ranks died with it"))
        store.transition(record.name, JobStatus.Failed, SecondaryStatus.Failed, "the supervisor died")
    except StorageError:  # a full disk: show the job as it is recorded; a later look marks it
        return fresh
    shutil.rmtree(runtime_dir(record.job_dir), ignore_errors=True)  # its hosts' sockets, which it could not remove
    return store.get(record.name)


def wait_job(store: JobStore, name: str, timeout: float | None = None, poll: float = 0.5) -> JobRecord:
    """Wait until the job has ended (Completed, Failed or Stopped)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        record = reconcile(store, store.get(name))
        if record.done:
            return record
        if record.supervisor_pid is None and time.time() - record.created > 120:
            raise ConfigError(
                f"job {name!r} was recorded but its supervisor never started; see its logs/supervisor.err"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {name!r} is still {record.status}/{record.secondary_status} after {timeout:g}s")
        time.sleep(poll)


def _supervisor_alive(record: JobRecord) -> int | None:
    """The supervisor's pid if that very process still runs (a zombie does not)."""
    return live_supervisor(Path(record.job_dir, "hora"))


def stop_job(store: JobStore, name: str) -> JobRecord:
    """Ask a running job to stop: its script gets SIGTERM, then SIGKILL after the spec's ``stop_grace``; the
    artifacts are archived and the job ends Stopped."""
    record = store.get(name)
    if record.done:
        return record
    store.update(name, stop_requested=1)
    pid = _supervisor_alive(record)
    if pid is not None and record.spec.get("ray"):  # a tuning trial on a Ray node: its tuning job stops it there
        store.transition(name, JobStatus.InProgress, SecondaryStatus.Stopping, "stop requested")
        return store.get(name)
    if pid is None:
        if record.supervisor_pid is None:
            raise ConfigError(f"job {name!r} has no supervisor yet; try again in a moment")
        store.transition(name, JobStatus.Stopped, SecondaryStatus.Stopped, "the supervisor had already gone")
        store.update(name, ended=time.time(), failure_reason="the job's supervisor process was gone when stopped")
        return store.get(name)
    store.transition(name, JobStatus.InProgress, SecondaryStatus.Stopping, "stop requested")
    os.kill(pid, signal.SIGTERM)
    return store.get(name)


def interrupt_job(store: JobStore, name: str, host: str | None = None) -> JobRecord:
    """Simulate a spot reclaim of a running spot job (``host``, default algo-1): its scripts get SIGTERM and
    ``stop_grace`` seconds, then the job restarts from its synced checkpoints (:mod:`hora.jobs.spot`)."""
    from hora.jobs.spot import request_interrupt

    request_interrupt(store, name, host, _supervisor_alive(store.get(name)))
    return store.get(name)


def remove_job(store: JobStore, name: str, artifacts: bool = False) -> tuple[list[str], list[str]]:
    """Delete an ended job from the store (``hora job rm``), so its name can be used again. Its artifacts are kept:
    those in the job's directory move to ``<home>/artifacts/<name>/`` first, those under a local ``output_path``
    stay where they are; with ``artifacts`` they are deleted too (``s3://`` ones are never touched). Returns (the
    artifacts kept, where; the artifacts deleted).

    Raises:
        ConfigError: the job is still running (stop it first).
    """
    record = reconcile(store, store.get(name))
    if not record.done:
        raise ConfigError(f"job {name} is {record.status}: stop it first (hora job stop {name} --wait), then remove it")
    job_dir = Path(record.job_dir).resolve()
    kept: list[str] = []
    removed: list[str] = []
    for where in sorted(record.artifacts.values()):
        path = Path(where)
        if where.startswith("s3://"):
            kept.append(where)
        elif not path.exists():
            continue
        elif artifacts:
            path.unlink()
            removed.append(where)
        elif path.resolve().is_relative_to(job_dir):
            target = store.home / "artifacts" / f"{name}-{int(record.created)}" / path.name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.move(str(path), target)
            kept.append(str(target))
        else:
            kept.append(where)
    store.remove(name)
    return kept, removed
