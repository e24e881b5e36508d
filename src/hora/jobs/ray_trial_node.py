"""The node side of a tuning trial on a Ray cluster (:mod:`.ray_trials`): one Ray actor per trial, which runs the
trial as an ordinary hora job on the node Ray placed it on.

Everything here runs in the actor's process, on its node. The node keeps, for one tuning job, a private directory
(:func:`node_dir`: ``$TMPDIR/hora-ray-<uid>/<run>-<node>/``) holding

- ``cache/<digest>/``: the job's code and local channels, unpacked from the archives the tuning job shipped once
  through Ray's object store (each archive once per node, whichever trial needs it first);
- ``home/``: a hora jobs home of the node's own, where the trials run (their job directories, logs, metrics).

A trial's job directory goes once its artifacts are home (:meth:`TrialNode.finish`); the whole directory goes when
the tuning job ends (:func:`clean_node_dir`, one task per node the tuning job used).

The trial's hora job supervisor is the actor's child, not detached, and gets SIGTERM when the actor dies
(PR_SET_PDEATHSIG, set by ``python -m hora.jobs._supervisor ... --parent PID``): the tuning job's supervisor
dying ends its actors (Ray's ownership), and with them the trials' scripts, archived and marked Stopped.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from hora.errors import ConfigError
from hora.jobs.api import remove_job, stop_job
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobStore
from hora.jobs.trial_mirror import node_answer

__all__ = ["TrialNode", "clean_node_dir", "node_dir"]


def node_dir(run_id: str, node_id: str) -> Path:
    """The node's private directory for tuning run ``run_id`` (the tuning job's name and a random suffix)."""
    return Path(tempfile.gettempdir()) / f"hora-ray-{os.getuid()}" / f"{run_id}-{node_id[:12]}"


def clean_node_dir(run_id: str) -> str:
    """Remove this node's directory of run ``run_id`` (and the per-user parent once empty); what was removed."""
    import ray

    where = node_dir(run_id, ray.get_runtime_context().get_node_id())
    shutil.rmtree(where, ignore_errors=True)
    try:
        where.parent.rmdir()
    except OSError:  # another tuning job's directory is still there
        pass
    return str(where)


def unpack(cache: Path, digest: str, ref: Any) -> Path:
    """The archive ``ref`` (an object ref of tar.gz bytes, named by its ``digest``) unpacked in ``cache``: fetched
    and unpacked only the first time on this node; actors racing for it each unpack, the first rename wins."""
    target = cache / digest
    if target.is_dir():
        return target
    import ray

    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = ray.get(ref)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")  # no absolute paths, no links out of it
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class TrialNode:
    """One trial on its node. Plain class; :class:`~hora.jobs.ray_trials.RayTrials` makes it a Ray actor."""

    def __init__(self, run_id: str) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.ip = ray.util.get_node_ip_address()
        self.base = node_dir(run_id, self.node_id)
        self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.store = JobStore(self.base / "home")
        self.name = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, spec: dict[str, Any], shipment: dict[str, Any]) -> dict[str, Any]:
        """Unpack the code and local channels, record the trial in the node's store and start its supervisor.
        Returns where it runs."""
        cache = self.base / "cache"
        digest, ref = shipment["code"]
        spec = dict(spec, inputs={k: dict(v) for k, v in spec.get("inputs", {}).items()})
        spec["source_dir"] = str(unpack(cache, digest, ref))
        for channel, (digest, ref, leaf) in shipment["channels"].items():
            where = unpack(cache, digest, ref)
            spec["inputs"][channel]["uri"] = str(where / leaf if leaf else where)
        self.name = spec["job_name"]
        record = self.store.create(self.name, spec)
        log = Path(record.job_dir) / "logs" / "supervisor.err"
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hora.jobs._supervisor", str(self.store.home), self.name,
                 "--parent", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, close_fds=True,
                start_new_session=True, cwd=record.job_dir)
        return {"node_id": self.node_id, "node_ip": self.ip, "hostname": socket.gethostname(),
                "node_job_dir": record.job_dir, "actor_pid": os.getpid()}

    def poll(self, cursor: dict[str, Any]) -> dict[str, Any]:
        """What is new since ``cursor`` (:func:`hora.jobs.trial_mirror.node_answer`)."""
        exited = self.proc is None or self.proc.poll() is not None
        if exited:
            self._settle()
        return node_answer(self.store, self.name, cursor, exited)

    def _settle(self) -> None:
        """A supervisor that exited without recording the job's end (it crashed before it could): Failed here."""
        record = self.store.get(self.name)
        if record.done:
            return
        try:
            err = (Path(record.job_dir) / "logs" / "supervisor.err").read_text(errors="replace")[-2000:]
        except OSError:
            err = ""
        code = None if self.proc is None else self.proc.returncode
        self.store.update(self.name, ended=time.time(), failure_reason=(
            f"InternalError: the trial's hora job supervisor on Ray node {self.ip} exited ({code}) without "
            f"finishing it{': ' + err.strip() if err.strip() else ''}"))
        self.store.transition(self.name, JobStatus.Failed, SecondaryStatus.Failed, "the supervisor died")

    def stop(self) -> None:
        """SIGTERM to the trial's script through its supervisor (hora's own stop, on this node)."""
        stop_job(self.store, self.name)

    def read(self, path: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of one of the trial's files (its artifacts), to bring them home."""
        job_dir = self.store.job_dir(self.name).resolve()
        p = Path(path).resolve()
        if not p.is_relative_to(job_dir):
            raise ConfigError(f"{path} is not a file of trial {self.name} on this node")
        with open(p, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def finish(self) -> None:
        """The trial is mirrored and its artifacts are home: its job directory on this node goes."""
        if self.proc is not None:
            self.proc.wait(timeout=60)
        remove_job(self.store, self.name, artifacts=True)
