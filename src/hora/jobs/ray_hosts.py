"""A job's hosts on a Ray cluster (``cluster: {ray: ADDRESS}``, ``hora job run --ray ADDRESS``): one host algo-K
per Ray node, reached like an SSH host.

The supervisor stays on this machine and connects to the cluster as a Ray driver. It reserves a placement group of
``instance_count`` bundles, one per node (``STRICT_SPREAD``), each of what one host's processes need
(:func:`bundle_of`), and places a host actor (:class:`HostNode`) on each bundle; algo-K is the node of the K-th
bundle. Each actor runs a command agent (:mod:`hora.jobs.command_agent`) on its node's address; the supervisor hands
it the job's agent secret through Ray (never a command line), and writes the agents' addresses
(``hora/ray-hosts.json``) and the secret (``hora/agent-secret``, 0600) into the job's directory here, where the
client :mod:`hora.jobs._ray_rsh` finds them. From there :class:`hora.jobs.remote_hosts.RemoteHosts` reaches the
hosts as it reaches SSH hosts (probe, shipping, channels, hora run's launch, results) through that client.

A host is named ``ray-<the first 12 hex digits of its node id>``: nodes of one machine share an address, never a
name. :meth:`RayHosts.close` stops the agents, kills the actors and removes the placement group; the actors and the
group are this driver's, so Ray ends them too when the supervisor dies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hora._runtime.auth import new_secret
from hora.config.variables import environment
from hora.errors import HostError
from hora.jobs import ray_driver
from hora.jobs._ray_rsh import HOSTS_FILE, SECRET_FILE
from hora.jobs.command_agent import CommandAgent
from hora.jobs.remote_spec import ClusterSpec
from hora.jobs.spec import JobSpec
from hora.jobs.store import write_private
from hora.runner.ssh import SshOptions

__all__ = ["HostNode", "RayHosts", "bundle_of", "clean", "host_name"]

#: Seconds the supervisor waits for the cluster to free the nodes the job asks for.
PLACEMENT_SECONDS = 300.0
#: Seconds one call to a host's actor may take.
CALL_SECONDS = 60.0
#: Instance types whose hosts get one GPU per process: SageMaker local mode's local_gpu, the ml.p* and ml.g* families.
_GPU_TYPE = re.compile(r"^(local_gpu|ml\.[pg]\d[a-z0-9-]*\..+)$")


def host_name(node_id: str) -> str:
    return f"ray-{node_id[:12]}"


def bundle_of(spec: JobSpec) -> dict[str, float]:
    """What one host asks of its node: a CPU per process (and for the parameter server beside them), and a GPU per
    process for a GPU instance type."""
    per_host = spec.processes_per_host + (1 if spec.strategy == "parameter_server" else 0)
    bundle = {"CPU": float(per_host)}
    if _GPU_TYPE.match(spec.instance_type):
        bundle["GPU"] = float(spec.processes_per_host)
    return bundle


def _connect(address: str, namespace: str) -> tuple[Any, bool]:
    return ray_driver.connect(address, f"hora-job-{namespace}-{os.getpid()}", "a job on a Ray cluster", address,
                              " (cluster.ray, --ray)")


def _said(resources: Mapping[str, float]) -> str:
    return " and ".join(f"{v:g} {k}{'s' if v != 1 else ''}" for k, v in sorted(resources.items()))


class RayHosts:
    """The placement of a job's hosts on the Ray cluster ``spec.cluster.address``; :meth:`place`, then ``hosts``,
    ``addresses``, ``ssh`` (the client as hora run's agent) and ``python`` (the nodes' Python)."""

    def __init__(self, spec: JobSpec, job_dir: Path, say: Callable[[str], None]) -> None:
        assert spec.cluster is not None and spec.cluster.address
        self.address, self.job_name, self.job_dir, self.say = spec.cluster.address, spec.job_name, job_dir, say
        self.count = spec.instance_count
        self.bundle = bundle_of(spec)
        self.port_range = spec.environment.get("HORA_PORT_RANGE", "")
        self.hosts: list[str] = []
        self.addresses: list[str] = []
        self.nodes: list[dict[str, Any]] = []
        self.given_python = spec.cluster.python
        self.python = sys.executable
        self.ssh = SshOptions(agent=[sys.executable, "-m", "hora.jobs._ray_rsh", str(job_dir)])
        self._ray: Any = None
        self._owned = False  # this supervisor connected to Ray (and disconnects at the end)
        self._group: Any = None
        self._actors: list[Any] = []

    def _nodes(self) -> tuple[list[dict[str, Any]], int]:
        """The live nodes and how many of them could hold one bundle."""
        alive = [n for n in self._ray.nodes() if n.get("Alive")]
        fits = sum(all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in self.bundle.items()) for n in alive)
        return alive, fits

    def _asked(self) -> str:
        return (f"the job asks the Ray cluster at {self.address} for {self.count} node(s) with {_said(self.bundle)} "
                "each (one host algo-K per node)")

    def _have(self, alive: list[dict[str, Any]], fits: int) -> str:
        listed = "; ".join(f"{n.get('NodeManagerAddress')} with "
                           + _said({k: v for k, v in n.get("Resources", {}).items() if k in ("CPU", "GPU")})
                           for n in alive) or "none alive"
        return f"the cluster has {fits} such node(s) (its nodes: {listed})"

    def place(self) -> None:
        """Reserve the nodes, start a host actor and its agent on each, and write where they listen."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray, self._owned = _connect(self.address, self.job_name)
        ray = self._ray
        alive, fits = self._nodes()
        if fits < self.count:
            raise HostError(f"{self._asked()}; {self._have(alive, fits)}: lower instance_count or "
                            "processes_per_host, or add nodes")
        self._group = placement_group([dict(self.bundle) for _ in range(self.count)], strategy="STRICT_SPREAD",
                                      name=f"hora-job-{self.job_name}")
        self.say(f"waiting for {self.count} Ray node(s) with {_said(self.bundle)} each (placement group, "
                 f"STRICT_SPREAD) on the Ray cluster at {self.address}")
        deadline, ready = time.monotonic() + PLACEMENT_SECONDS, self._group.ready()
        while not ray.wait([ready], timeout=1.0)[0]:  # each second: could it still be placed?
            alive, fits = self._nodes()
            if fits < self.count or time.monotonic() > deadline:
                why = "" if fits < self.count else f" but they did not become free within {PLACEMENT_SECONDS:g}s"
                raise HostError(f"{self._asked()}; {self._have(alive, fits)}{why}")
        cls = ray.remote(HostNode)
        self._actors = [
            cls.options(num_cpus=self.bundle["CPU"], num_gpus=self.bundle.get("GPU", 0.0), max_restarts=0,
                        max_task_retries=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                            self._group, placement_group_bundle_index=i)).remote()
            for i in range(self.count)]
        secret = new_secret()
        try:
            self.nodes = ray.get([a.start.remote(secret, self.port_range) for a in self._actors], timeout=CALL_SECONDS)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            raise HostError(f"the job's host actors could not start their agents on the Ray nodes: {exc}") from None
        self.hosts = [host_name(n["node_id"]) for n in self.nodes]
        self.addresses = [str(n["address"]) for n in self.nodes]
        pythons = sorted({str(n["python"]) for n in self.nodes})
        if len(pythons) > 1 and not self.given_python:
            raise HostError(f"Ray's workers run different Pythons on the job's nodes ({', '.join(pythons)}); name the "
                            "one that runs hora and the script on every node with cluster.python")
        self.python = self.given_python or pythons[0]
        write_private(self.job_dir / "hora" / SECRET_FILE, secret.hex())
        listed = {h: {k: n[k] for k in ("address", "port", "node_id", "hostname")}
                  for h, n in zip(self.hosts, self.nodes)}
        write_private(self.job_dir / "hora" / HOSTS_FILE, json.dumps({"cluster": self.address, "hosts": listed}))
        for i, n in enumerate(self.nodes):
            self.say(f"algo-{i + 1} on Ray node {n['address']} ({n['hostname']}, node id {n['node_id']}) as host "
                     f"{self.hosts[i]}: its agent listens on {n['address']}:{n['port']}")

    def close(self) -> None:
        """Stop the agents (what still runs there), kill the actors, remove the placement group; forget the secret."""
        ray = self._ray
        if ray is None:
            return
        try:
            if self._actors:
                ray.wait([a.stop.remote() for a in self._actors], num_returns=len(self._actors), timeout=CALL_SECONDS)
            for actor in self._actors:
                ray.kill(actor, no_restart=True)
            if self._group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self._group)
        except Exception as exc:  # the cluster went meanwhile: Ray ends the driver's actors and group itself
            self.say(f"could not release the job's Ray actors and placement group: {exc}")
        finally:
            self._actors, self._group, self._ray = [], None, None
            (self.job_dir / "hora" / SECRET_FILE).unlink(missing_ok=True)
            if self._owned:
                ray.shutdown()


class HostNode:
    """One host of a job on its Ray node (a Ray actor on the host's bundle): runs the host's command agent."""

    def __init__(self) -> None:
        self.agent: CommandAgent | None = None

    def start(self, secret: bytes, port_range: str) -> dict[str, Any]:
        """Listen on this node's address; where, and this node's identity and Python."""
        import ray

        address = ray.util.get_node_ip_address()
        env = environment()
        env.pop("OMP_NUM_THREADS", None)  # Ray's per-actor value: the ranks get hora's defaults (or the spec's)
        self.agent = CommandAgent(secret, address, port_range, env, cwd=os.path.expanduser("~"))
        return {"node_id": ray.get_runtime_context().get_node_id(), "address": address, "port": self.agent.start(),
                "hostname": socket.gethostname(), "python": sys.executable}

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.close()


def _clean_node(work_dir: str, job: str | None) -> str:
    """Remove this node's work directory of the jobs (or of one job); what was removed (a Ray task on the node)."""
    import ray

    host = host_name(ray.get_runtime_context().get_node_id())
    root = Path(os.path.expanduser(work_dir.replace("{host}", host)))
    target = root / job if job else root
    shutil.rmtree(target, ignore_errors=True)
    return f"{host} ({ray.util.get_node_ip_address()}): {target}"


def clean(cluster: ClusterSpec, job: str | None) -> list[str]:
    """``hora job clean --ray``: remove ``<work_dir>/<job>`` (or the whole work dir) on every live node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    assert cluster.address
    ray, owned = _connect(cluster.address, f"clean-{job or 'all'}")
    try:
        task = ray.remote(_clean_node)
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(cluster.work_dir, job) for node in nodes]
        return [str(r) for r in ray.get(refs, timeout=CALL_SECONDS)]
    finally:
        if owned:
            ray.shutdown()
