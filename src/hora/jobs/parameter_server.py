"""SageMaker's ``parameter_server`` distribution, as its TensorFlow container runs it
(``sagemaker_tensorflow_container/training.py``: ``_build_tf_config_for_ps``, ``_run_ps``, ``_run_worker``,
``_wait_until_master_is_down``):

- one worker process per host — the script, run once on each host;
- ``TF_CONFIG`` for the script: a cluster of ``master`` (algo-1), ``worker`` (the other hosts) and ``ps`` (every
  host) tasks, the master and workers on port 2222 and the parameter servers on port 2223, and the host's own
  ``task`` (``master`` 0 on algo-1, ``worker`` i on the others);
- beside it, TensorFlow's own parameter-server task (``tf.distribute.Server``, job ``ps``, task index = the host's
  index, no GPU), here a process of its own (:mod:`hora.jobs._tf_ps`) started by the host's rank wrapper
  (:mod:`hora.jobs._entry`), which stops it when the job ends on that host and turns its death into the job's
  failure reason;
- the other hosts keep their parameter server until the master's script has ended (the container polls the
  master's port 2222 for that; hora watches the master's end directly: see :class:`MasterWatch`);
- with one host there is no parameter server and no ``TF_CONFIG``: the container enables the distribution only
  when ``len(hosts) > 1``.

The other kind of server, hora's own (``hora.ps``), is the spec's ``servers: hora``: the master's hora run starts
one per host (``--ps-per-host 1``, :func:`hora_ps_run_settings`), on one host too, beside the host's one worker; the
script reaches them with ``hora.ps.connect()`` through hora's own variables, with no TF_CONFIG and no TensorFlow
task. They serve until the master's hora run ends (every host's worker done), then stop with the job.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hora.errors import ConfigError
from hora.jobs.plan import JobPlan, ParameterServerPlan
from hora.jobs.records import RankEnd

__all__ = [
    "PS_PORT",
    "WORKER_PORT",
    "MasterWatch",
    "build_tf_config",
    "hora_ps_run_settings",
    "launch_settings",
    "plan_entry",
    "ps_command",
    "reachable",
    "tf_config_for",
]

#: The ports SageMaker's TensorFlow container gives the tasks: master and workers 2222, parameter servers 2223.
WORKER_PORT = 2222
PS_PORT = 2223


def build_tf_config(
    hosts: Sequence[str],
    current_host: str,
    ps_task: bool = False,
    worker_addresses: Sequence[str] | None = None,
    ps_addresses: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The container's ``_build_tf_config_for_ps``, key order included (``json.dumps`` of it is TF_CONFIG).

    ``worker_addresses`` / ``ps_addresses`` (one per host, in host order) replace the container's
    ``<host>:2222`` / ``<host>:2223``, for hosts whose names do not resolve (``network: loopback``).
    """
    workers_at = list(worker_addresses or [f"{h}:{WORKER_PORT}" for h in hosts])
    ps_at = list(ps_addresses or [f"{h}:{PS_PORT}" for h in hosts])
    masters, workers = list(hosts[:1]), list(hosts[1:])
    ps = list(hosts) if len(hosts) > 1 else None
    tf_config: dict[str, Any] = {"cluster": {"master": workers_at[:1]}, "environment": "cloud"}
    if ps:
        tf_config["cluster"]["ps"] = ps_at
    if workers:
        tf_config["cluster"]["worker"] = workers_at[1:]
    if ps_task:
        if ps is None:
            raise ValueError("Cannot have a ps task if there are no parameter servers in the cluster")
        task_type, task_index = "ps", ps.index(current_host)
    elif current_host == masters[0]:
        task_type, task_index = "master", 0
    else:
        task_type, task_index = "worker", workers.index(current_host)
    tf_config["task"] = {"index": task_index, "type": task_type}
    return tf_config


def _free_ports(addresses: Sequence[str]) -> list[int]:
    """A free port of each address, all different, outside the kernel's ephemeral range where it can: the
    TensorFlow tasks bind them seconds later (after importing TensorFlow), and a port of that range may meanwhile be
    handed to any ``bind(0)`` or ``connect`` on this machine, which made a task fail with "Could not start gRPC
    server". Every socket stays bound until all are chosen."""
    low = _ephemeral_low()
    pool = list(range(10000, low)) if low > 12000 else []  # else: the kernel's own choice, as before
    random.shuffle(pool)
    candidates = iter(pool)
    sockets = []
    try:
        for address in addresses:
            s = socket.socket()
            sockets.append(s)
            for port in [*itertools.islice(candidates, 200), 0]:  # 0: the kernel's choice, the last resort
                try:
                    s.bind((address, port))
                    break
                except OSError:
                    if port == 0:
                        raise
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux: ip_local_port_range; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def plan_entry(
    strategy: str, servers: str, hosts: list[str], addresses: list[str], namespaces: bool, remote: bool = False
) -> ParameterServerPlan | None:
    """What the job's plan says about the parameter servers: None unless the job runs the ``parameter_server``
    distribution on more than one host. With a network namespace per host every host has the container's ports
    and its name resolves (``algo-1:2222``); on loopback addresses the hosts share one port space, so each task
    gets a free port of its host's address (``127.0.0.2:41234``), chosen here. On ``remote`` hosts (real machines,
    ``cluster:``) every host has its own ports too, but ``algo-K`` resolves there only for root: the tasks are
    addressed by the hosts' addresses (``10.0.0.2:2222``); nothing is chosen here, where those addresses are not
    this machine's."""
    if strategy != "parameter_server":
        return None
    if servers == "hora":  # hora run places and addresses them itself (hora.ps.connect reads the job's store)
        return ParameterServerPlan(servers)
    if len(hosts) < 2:
        return None
    if namespaces or remote:
        names = addresses if remote else hosts
        worker_at = [_host_port(h, WORKER_PORT) for h in names]
        ps_at = [_host_port(h, PS_PORT) for h in names]
    else:
        ports = _free_ports([*addresses, *addresses])
        worker_at = [f"{a}:{p}" for a, p in zip(addresses, ports)]
        ps_at = [f"{a}:{p}" for a, p in zip(addresses, ports[len(addresses):])]
    return ParameterServerPlan(servers, tuple(worker_at), tuple(ps_at))


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address goes in brackets


def tf_config_for(
    servers: ParameterServerPlan | None, hosts: Sequence[str], host: str, ps_task: bool = False
) -> dict[str, Any] | None:
    """``host``'s TF_CONFIG (the ps task's with ``ps_task``), or None when the job runs no TensorFlow parameter
    servers (``servers`` is the plan's :attr:`~hora.jobs.plan.JobPlan.parameter_server`)."""
    if servers is None or servers.servers != "tensorflow":
        return None
    return build_tf_config(hosts, host, ps_task, servers.worker_addresses, servers.ps_addresses)


def ps_command(
    servers: ParameterServerPlan | None, hosts: Sequence[str], host: str, python: str = sys.executable
) -> list[str]:
    """The command of ``host``'s TensorFlow parameter-server task (:mod:`hora.jobs._tf_ps`)."""
    config = tf_config_for(servers, hosts, host, ps_task=True)
    if config is None:
        raise ConfigError("the job runs no TensorFlow parameter servers")
    return [python, "-m", "hora.jobs._tf_ps", json.dumps(config["cluster"]), str(config["task"]["index"])]


def reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class MasterWatch:
    """Whether the master's script has ended in this attempt, for a worker host that keeps its parameter server
    until then.

    SageMaker's container polls ``curl algo-1:2222`` every 10 s; hora reads the master's end from the job's
    directory (its wrapper's record, see _entry.py), at once and also for a master that never listens on 2222. A
    record the master could not write (a full disk) must not keep the workers forever: the master's own parameter
    server, stopped when its script ends, going away after it served says the same.
    """

    PROBE_SECONDS = 1.0

    def __init__(self, job_dir: Path, attempt: int, master_ps: str, master_rank: int = 0) -> None:
        self.record = RankEnd.path(job_dir, attempt, master_rank)
        self.master_ps = master_ps
        self.served = False
        self.last_probe = 0.0

    def ended(self) -> bool:
        if self.record.exists():
            return True
        now = time.monotonic()
        if now - self.last_probe < self.PROBE_SECONDS:
            return False
        self.last_probe = now
        up = reachable(self.master_ps)
        self.served = self.served or up
        return self.served and not up


def hora_ps_run_settings(host_count: int) -> dict[str, Any]:
    """The ``hora run`` settings of hora's own parameter servers (``servers: hora``): one ``hora.ps`` server per
    host beside the workers, which the master host's hora run (``_host.run_master``) merges into its ``LaunchSpec``
    settings; the ranks find the servers through hora's own variables (``hora.ps.connect()``), not TF_CONFIG."""
    if host_count < 1:
        raise ConfigError(f"a parameter_server job needs at least one host, got {host_count}")
    return {"num_ps": host_count, "ps_per_host": 1}


def launch_settings(plan: JobPlan) -> dict[str, Any]:
    """The hora run settings the job's launch uses (the master host's, or the supervisor's for a job on remote
    hosts): the plan's, with hora's own parameter servers merged in when the job has them."""
    settings = dict(plan.run_settings)
    servers = plan.parameter_server
    if servers is not None and servers.servers == "hora":  # the hook: hora's own parameter servers, one per host
        settings.update(hora_ps_run_settings(len(plan.hosts)))
    return settings
