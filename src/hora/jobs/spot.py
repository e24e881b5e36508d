"""SageMaker managed spot training for local jobs: ``use_spot_instances`` with ``max_wait``, reclaims simulated by
``hora job interrupt`` or the spec's ``spot_interruptions`` schedule, and the times SageMaker reports.

A reclaim (as on SageMaker, of the whole job whichever host it names) sends SIGTERM to every rank through the
master's hora run, which gives the scripts ``stop_grace`` seconds (SageMaker: a two-minute notice) before SIGKILL.
The attempt's checkpoints are synced out; the job is ``InProgress / Interrupted`` while it "waits for capacity"
(:data:`CAPACITY_WAIT`), then ``Restarting``: every host starts afresh, as a new instance would — empty
``model/``, ``output/`` *and* ``checkpoints/`` —, the checkpoints are restored from ``checkpoint_path``, and the
script runs again. Reclaims do not count against ``max_retry_attempts``. ``max_run`` bounds the time the job
trained (summed over attempts, what SageMaker bills); ``max_wait`` the whole job, waits included: past it the job
ends ``Stopped / MaxWaitTimeExceeded``.

Checkpoints are synced out while the script runs (every :data:`SYNC_SECONDS`), not only at the end of an attempt,
so a reclaim that kills a rank mid-write loses at most what changed since the last sync.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hora.errors import ConfigError
from hora.jobs.states import SecondaryStatus
from hora.jobs.store import JobStore, write_private

__all__ = [
    "CAPACITY_WAIT",
    "INTERRUPT_SIGNAL",
    "SYNC_SECONDS",
    "CheckpointSync",
    "billable_seconds",
    "read_interrupt",
    "request_interrupt",
    "schedule_interruptions",
]

#: How long an interrupted job waits "for spot capacity" before it restarts.
CAPACITY_WAIT = 2.0
#: How often a job's checkpoints are synced out while it runs.
SYNC_SECONDS = 2.0
#: What ``hora job interrupt`` sends the job's supervisor (its request is in ``hora/interrupt.json``).
INTERRUPT_SIGNAL = signal.SIGUSR2


def _request_file(job_dir: str | os.PathLike[str]) -> Path:
    return Path(job_dir) / "hora" / "interrupt.json"


def request_interrupt(store: JobStore, name: str, host: str | None, supervisor: int | None) -> None:
    """Ask the job's supervisor (pid ``supervisor``) to simulate a spot reclaim of ``host`` (default algo-1).

    Raises:
        ConfigError: the job is not a spot job, has ended, names no such host, or has no supervisor.
    """
    record = store.get(name)
    if not record.spec.get("use_spot_instances"):
        raise ConfigError(f"job {name!r} does not use spot instances (use_spot_instances: true); stop it instead")
    if record.done:
        raise ConfigError(f"job {name!r} has already ended ({record.status})")
    count = int(record.spec.get("instance_count", 1))
    hosts = [f"algo-{i}" for i in range(1, count + 1)]
    host = host or hosts[0]
    if host not in hosts:
        raise ConfigError(f"job {name!r} has hosts {', '.join(hosts)}, not {host!r}")
    if supervisor is None:
        raise ConfigError(f"job {name!r} has no running supervisor to interrupt")
    _request(record.job_dir, host, supervisor)


def _request(job_dir: str | os.PathLike[str], host: str, supervisor: int) -> None:
    """Write the reclaim request, then signal the supervisor to act on it."""
    write_private(_request_file(job_dir), json.dumps({"host": host, "time": time.time()}))
    os.kill(supervisor, INTERRUPT_SIGNAL)


def read_interrupt(job_dir: str | os.PathLike[str]) -> str:
    """The host the last request named (algo-1 when the request is unreadable)."""
    try:
        return str(json.loads(_request_file(job_dir).read_text())["host"])
    except (OSError, ValueError, KeyError):
        return "algo-1"


def schedule_interruptions(
    job_dir: str | os.PathLike[str], times: tuple[float, ...], hosts: int
) -> list[threading.Timer]:
    """The spec's ``spot_interruptions``: a reclaim of algo-1, algo-2, ... in turn, that many seconds after the
    job started (for tests and rehearsals)."""
    timers = []
    for i, at in enumerate(times):

        def fire(host: str = f"algo-{i % hosts + 1}") -> None:
            _request(job_dir, host, os.getpid())

        timer = threading.Timer(at, fire)
        timer.daemon = True
        timer.start()
        timers.append(timer)
    return timers


def billable_seconds(transitions: list[tuple[float, str, str, str]], ended: float | None) -> float:
    """The time the job spent training (``Training`` secondary status), summed: what SageMaker bills."""
    total, since = 0.0, None
    for when, _status, secondary, _message in transitions:
        if since is not None:
            total += when - since
            since = None
        if secondary == SecondaryStatus.Training:
            since = when
    if since is not None:
        total += (ended or time.time()) - since
    return total


class CheckpointSync:
    """Syncs the hosts' checkpoint directories out every :data:`SYNC_SECONDS` while an attempt runs."""

    def __init__(self, sync: Callable[[], None], say: Callable[[str], None]) -> None:
        self._sync, self._say = sync, say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hora-job-checkpoint-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SYNC_SECONDS):
            try:
                self._sync()
            except Exception as exc:  # a file removed mid-copy, a full disk: the next round tries again
                self._say(f"syncing checkpoints out failed (trying again in {SYNC_SECONDS:g}s): {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30.0)
