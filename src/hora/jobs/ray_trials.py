"""Tuning trials on a Ray cluster: the trial runner (:mod:`.trials`) a tuning job uses with ``ray_address``.

The tuning job's supervisor connects to the cluster as a Ray driver. It packs the trials' code (``source_dir``) and
local input channels once, puts the archives in Ray's object store, and starts each trial as one Ray actor
(:class:`~hora.jobs.ray_trial_node.TrialNode`) asking for the trial's resources (``instance_count *
processes_per_host`` CPUs unless ``ray_resources`` says otherwise), so Ray places it on a node that has them. The
actor unpacks what it needs (once per node), runs the trial there as an ordinary hora job, and answers polls with
what is new; this side mirrors that into the launching machine's job store (:mod:`.trial_mirror`), where the trial
is an ordinary job: the tuning job reads its objective from the mirrored metrics, ``hora job describe`` shows the
node. Once it has ended, its artifacts come home to where a local trial's would be, and its directory on the node
goes. A trial whose actor dies (its node was lost) fails with a reason naming the node; the tuning job goes on.

The actors are the supervisor's (not detached): if the supervisor dies, Ray ends them and their trials.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hora.errors import ConfigError, HoraError
from hora.jobs import ray_driver
from hora.jobs.ray_driver import last_line
from hora.jobs.ray_trial_node import TrialNode, clean_node_dir
from hora.jobs.spec import JobSpec
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobRecord, JobStore, record_supervisor
from hora.jobs.trial_mirror import TrialMirror
from hora.jobs.trials import TrialRunner

__all__ = ["RayTrials", "pack", "trial_resources"]

#: Seconds one call to a trial's actor may take before this round gives up on it (the next round asks again).
CALL_TIMEOUT = 60.0
#: Bytes of an artifact per call when bringing it home.
ARTIFACT_CHUNK = 8 << 20


def pack(path: Path) -> tuple[str, bytes]:
    """A directory's contents (or one file) as tar.gz bytes, and their digest: entries in sorted order and no
    timestamp in the gzip header, so the same files give the same digest."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=1) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                tar.add(p, arcname=str(p.relative_to(path)), recursive=False)
        else:
            tar.add(path, arcname=path.name)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest()[:32], data


def trial_resources(spec: JobSpec, resources: dict[str, float] | None) -> dict[str, float]:
    """What each trial's actor asks Ray for: ``resources``, else one CPU per process of the trial."""
    return dict(resources) if resources else {"CPU": float(spec.instance_count * spec.processes_per_host)}


def _fits(request: dict[str, float], total: dict[str, float]) -> bool:
    return all(total.get(k, 0.0) >= v for k, v in request.items() if v > 0)


@dataclass
class _Trial:
    actor: Any
    start_ref: Any
    mirror: TrialMirror
    spec: dict[str, Any]  # the mirrored record's spec (with its "ray" placement)
    placed: dict[str, Any] | None = None  # TrialNode.start's answer
    stop_pending: bool = False
    problems: list[str] = field(default_factory=list)  # artifacts that could not be brought home


class RayTrials(TrialRunner):
    """Trials as Ray actors on the cluster at ``address`` (Ray's own spelling: ``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``), mirrored into ``store``."""

    def __init__(self, store: JobStore, tuning_name: str, template: JobSpec, address: str,
                 resources: dict[str, float] | None = None) -> None:
        self.store, self.address = store, address
        self.run_id = f"{tuning_name}-{uuid.uuid4().hex[:8]}"
        self.request = trial_resources(template, resources)
        self._ray, self._owned = ray_driver.connect(address, f"hora-tuning-{self.run_id}",
                                                    "running trials on a Ray cluster (ray_address)",
                                                    f"ray_address={address!r}", "", ConfigError)
        problem = self._infeasible()
        if problem:
            raise ConfigError(problem)
        self.shipment = self._ship(template)
        self.trials: dict[str, _Trial] = {}
        self.nodes_used: set[str] = set()
        self._actor_cls: Any = self._ray.remote(TrialNode)

    def _infeasible(self) -> str | None:
        """Why no node of the cluster can ever take a trial (None when one can)."""
        nodes = [n.get("Resources", {}) for n in self._ray.nodes() if n.get("Alive")]
        if any(_fits(self.request, total) for total in nodes):
            return None
        have = "; ".join(", ".join(f"{k} {v:g}" for k, v in sorted(t.items()) if not k.startswith("node:")
                                   and k not in ("memory", "object_store_memory")) for t in nodes) or "no live node"
        want = ", ".join(f"{k} {v:g}" for k, v in sorted(self.request.items()))
        return (f"each trial asks Ray for {want}, but no node of the Ray cluster at {self.address} has that much "
                f"(its nodes: {have}); lower instance_count * processes_per_host, set ray_resources to what one "
                "trial needs, or add a larger node")

    def _ship(self, template: JobSpec) -> dict[str, Any]:
        """The code and the local channels, packed and put in Ray's object store once for the whole tuning job."""
        put = self._ray.put
        digest, data = pack(Path(template.source_dir))
        shipment: dict[str, Any] = {"code": (digest, put(data)), "channels": {}}
        for channel in template.inputs:
            if channel.is_s3:
                continue  # fetched by the trial on its node
            path = Path(channel.uri)
            if not path.exists():
                raise ConfigError(f"channel {channel.name!r}: {channel.uri} does not exist on this machine")
            digest, data = pack(path)
            shipment["channels"][channel.name] = (digest, put(data), None if path.is_dir() else path.name)
        return shipment

    # -- the runner ---------------------------------------------------------------------------------------------
    def start(self, spec: JobSpec) -> None:
        name = spec.job_name
        mirrored = spec.to_dict()
        mirrored["ray"] = {"address": self.address, "resources": self.request}
        self.store.create(name, mirrored)
        job_dir = self.store.job_dir(name)
        record_supervisor(job_dir / "hora")  # this process: if it dies, the trial (its actor) dies with it
        self.store.update(name, supervisor_pid=os.getpid())
        try:
            self._place(name, spec, mirrored)
        except Exception as exc:  # recorded as its end here, so the mirrored job does not stay InProgress
            self.store.update(name, ended=time.time(), failure_reason=f"InternalError: {type(exc).__name__}: {exc}")
            self.store.transition(name, JobStatus.Failed, SecondaryStatus.Failed, "the trial could not be placed")
            self.trials.pop(name, None)
            raise ConfigError(f"trial {name} could not be placed on the Ray cluster: {exc}") from None

    def _place(self, name: str, spec: JobSpec, mirrored: dict[str, Any]) -> None:
        """Ask Ray for an actor with the trial's resources and start the trial in it, once Ray has placed it."""
        on_node = spec.to_dict()
        for key in ("output_path", "checkpoint_path"):  # local ones are this machine's: artifacts come home
            if not str(on_node.get(key) or "").startswith("s3://"):
                on_node[key] = None
        num_cpus = self.request.get("CPU", 0.0)
        num_gpus = self.request.get("GPU", 0.0)
        custom = {k: v for k, v in self.request.items() if k not in ("CPU", "GPU")}
        actor = self._actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, resources=custom or None,
                                        max_restarts=0, max_task_retries=0).remote(self.run_id)
        self.trials[name] = _Trial(actor, actor.start.remote(on_node, self.shipment), TrialMirror(self.store, name),
                                   mirrored)
        self.store.transition(name, JobStatus.InProgress, SecondaryStatus.Starting,
                              f"waiting for a Ray node with {', '.join(f'{k} {v:g}' for k, v in self.request.items())}")

    def poll(self, name: str) -> JobRecord:
        record = self.store.get(name)
        t = self.trials.get(name)
        if t is None or record.done:
            return record
        if record.stop_requested and not t.stop_pending:  # hora job stop TRIAL on this machine
            try:
                self.stop(name)
            except HoraError:
                pass
        if not self._placed(name, t):
            return self.store.get(name)
        try:
            answer = self._ray.get(t.actor.poll.remote(t.mirror.cursor), timeout=CALL_TIMEOUT)
        except self._ray.exceptions.GetTimeoutError:
            return self.store.get(name)  # a slow or partitioned node: ask again next round
        except self._ray.exceptions.RayError as exc:
            return self._lost(name, t, exc)
        artifacts = self._bring_home(name, t, answer["record"]["artifacts"]) if answer["final"] else None
        t.mirror.apply(answer, artifacts)
        if answer["final"]:
            if t.problems:
                reason = answer["record"]["failure_reason"]
                lost = (f"the artifacts could not be brought home from Ray node {t.placed and t.placed['node_ip']}: "
                        + "; ".join(t.problems))
                self.store.update(name, failure_reason=f"{reason}\n(also: {lost})" if reason else lost)
                self.store.save_record(name)
            try:
                self._ray.get(t.actor.finish.remote(), timeout=CALL_TIMEOUT)
            except self._ray.exceptions.RayError:
                pass  # its directory stays until the tuning job's end cleans the node
            self._end(name)
        return self.store.get(name)

    def stop(self, name: str) -> None:
        t = self.trials.get(name)
        if t is None:
            return
        t.stop_pending = True
        if t.placed is None and not self._placed(name, t):
            if name in self.trials:  # still waiting for a node: nothing runs yet
                self._finish_here(name, JobStatus.Stopped, SecondaryStatus.Stopped,
                                  "stopped before Ray placed the trial on a node")
            return
        if name not in self.trials:
            return
        try:
            self._ray.get(t.actor.stop.remote(), timeout=CALL_TIMEOUT)
        except self._ray.exceptions.RayTaskError as exc:
            t.stop_pending = False
            raise ConfigError(f"trial {name} on Ray node {t.placed and t.placed['node_ip']}: "
                              f"{last_line(exc)}") from None
        except self._ray.exceptions.RayError as exc:  # its node is gone: the next poll fails it
            t.stop_pending = False
            raise ConfigError(f"trial {name}: {last_line(exc)}") from None

    def close(self) -> None:
        """Kill the actors left, clean every node this tuning job used, disconnect."""
        for name in list(self.trials):
            self._kill(self.trials.pop(name))
        try:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            alive = {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")}
            clean = self._ray.remote(clean_node_dir)
            refs = [clean.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                    .remote(self.run_id) for node in sorted(self.nodes_used & alive)]
            self._ray.get(refs, timeout=CALL_TIMEOUT)
        except Exception as exc:  # the cluster or a node went meanwhile: what was there stays (docs/tuning.md)
            print(f"hora job tune: could not clean the Ray nodes' directories of {self.run_id}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            if self._owned:
                self._ray.shutdown()

    # -- the steps ------------------------------------------------------------------------------------------------
    def _placed(self, name: str, t: _Trial) -> bool:
        """Whether Ray has placed the trial and it runs on its node (noted in the mirror when first seen)."""
        if t.placed is not None:
            return True
        ready, _ = self._ray.wait([t.start_ref], timeout=0)
        if not ready:
            problem = self._infeasible()  # a node that could take it was lost: fail it instead of waiting forever
            if problem:
                self._finish_here(name, JobStatus.Failed, SecondaryStatus.Failed, f"ClientError: {problem}")
            return False
        try:
            t.placed = self._ray.get(t.start_ref)
        except self._ray.exceptions.RayTaskError as exc:
            self._finish_here(name, JobStatus.Failed, SecondaryStatus.Failed,
                              f"ClientError: the trial could not start on its Ray node: {last_line(exc)}")
            return False
        except self._ray.exceptions.RayError as exc:
            self._finish_here(name, JobStatus.Failed, SecondaryStatus.Failed,
                              f"InternalError: the trial's Ray actor died before it started: {last_line(exc)}")
            return False
        assert t.placed is not None
        self.nodes_used.add(t.placed["node_id"])
        t.spec["ray"].update(t.placed)
        self.store.update_spec(name, t.spec)
        self.store.transition(name, JobStatus.InProgress, SecondaryStatus.Starting,
                              f"placed on Ray node {t.placed['node_ip']} ({t.placed['node_id'][:12]})")
        return True

    def _lost(self, name: str, t: _Trial, exc: BaseException) -> JobRecord:
        where = t.placed or {}
        self._finish_here(name, JobStatus.Failed, SecondaryStatus.Failed, (
            f"InternalError: the trial's Ray actor on node {where.get('node_ip')} (node id {where.get('node_id')}, "
            f"{where.get('hostname')}) died: the node was lost or the actor was killed ({last_line(exc)})"))
        return self.store.get(name)

    def _finish_here(self, name: str, status: JobStatus, secondary: SecondaryStatus, reason: str) -> None:
        """End a trial that cannot end on a node (never placed, or its node is gone) in this store."""
        self.store.update(name, ended=time.time(), failure_reason=reason)
        self.store.transition(name, status, secondary, reason.splitlines()[0])
        self.store.save_record(name)
        self._end(name)

    def _end(self, name: str) -> None:
        t = self.trials.pop(name, None)
        if t is not None:
            self._kill(t)

    def _kill(self, t: _Trial) -> None:
        try:
            self._ray.kill(t.actor, no_restart=True)
        except Exception:  # gone already
            pass

    def _bring_home(self, name: str, t: _Trial, artifacts: dict[str, str]) -> dict[str, str]:
        """Copy the trial's artifacts from its node to where a local trial keeps them: ``<output_path>/<name>/
        output/`` for a local output_path, else the job's own ``output/``. ``s3://`` ones were uploaded there."""
        out: dict[str, str] = {}
        output_path = t.spec.get("output_path")
        dest_dir = (Path(output_path) / name / "output" if output_path and not output_path.startswith("s3://")
                    else self.store.job_dir(name) / "output")
        for kind, where in artifacts.items():
            if where.startswith("s3://"):
                out[kind] = where
                continue
            if Path(where).name in ("", ".", ".."):  # only a file's own name is taken from the node
                t.problems.append(f"{kind} ({where}): not a file's path")
                continue
            dest = dest_dir / Path(where).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
            try:
                with open(tmp, "wb") as f:
                    offset = 0
                    while True:
                        chunk = self._ray.get(t.actor.read.remote(where, offset, ARTIFACT_CHUNK), timeout=CALL_TIMEOUT)
                        f.write(chunk)
                        offset += len(chunk)
                        if len(chunk) < ARTIFACT_CHUNK:
                            break
                os.replace(tmp, dest)
            except (OSError, self._ray.exceptions.RayError) as exc:
                tmp.unlink(missing_ok=True)
                t.problems.append(f"{kind} ({where}): {last_line(exc)}")
                continue
            out[kind] = str(dest)
        return out
