"""The job's plan: what the supervisor decides once, before the first attempt, and every process of the job reads
(``hora/plan.json``): the hosts and their addresses, the network, the command, the hora run settings, the
parameter servers, the metric definitions and the system metrics' sampling interval.

One frozen record (:class:`JobPlan`) with one writer (:meth:`JobPlan.to_json`, :meth:`JobPlan.write`) and one
reader (:meth:`JobPlan.from_json`, :meth:`JobPlan.read`), used by the supervisor (:mod:`hora.jobs.lifecycle`), each
host (:mod:`hora.jobs._host`, :mod:`hora.jobs._rsh`), each rank's wrapper (:mod:`hora.jobs._entry`) and
``hora job describe``. The reader checks every field and names the first that is wrong, so a plan that hora did not
write (or an older hora wrote) is a clear error instead of a ``KeyError`` in one of the job's processes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora.errors import StorageError
from hora.jobs.json_fields import Fields
from hora.jobs.spec import MetricDefinition
from hora.jobs.store import write_private

__all__ = ["NETWORKS", "PLAN_FILE", "PS_SERVERS", "JobPlan", "ParameterServerPlan", "plan_path"]

#: The plan's file, in the job directory.
PLAN_FILE = Path("hora", "plan.json")
#: How the hosts got their addresses (:mod:`hora.jobs.cluster`; ``ssh``: real hosts, :mod:`hora.jobs.remote_hosts`;
#: ``kubernetes``: pods of an Indexed Job, their DNS names resolved by :mod:`hora.jobs.k8s_entry`).
NETWORKS = ("namespace", "loopback", "ssh", "kubernetes")
#: Whose parameter servers run beside the workers (the spec's ``servers``).
PS_SERVERS = ("tensorflow", "hora")


def plan_path(job_dir: str | os.PathLike[str]) -> Path:
    return Path(job_dir) / PLAN_FILE


@dataclass(frozen=True)
class ParameterServerPlan:
    """The ``parameter_server`` distribution's servers (:mod:`hora.jobs.parameter_server`): ``hora`` (hora run
    places them; no addresses here) or ``tensorflow`` (one worker and one ps task per host, at these addresses,
    ``host:port``, in host order)."""

    servers: str
    worker_addresses: tuple[str, ...] = ()
    ps_addresses: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.servers == "hora":
            return {"servers": self.servers}
        return {
            "servers": self.servers,
            "worker_addresses": list(self.worker_addresses),
            "ps_addresses": list(self.ps_addresses),
        }


@dataclass(frozen=True)
class JobPlan:
    """What every process of a job needs to know about it (see the module docstring). Host ``hosts[i]`` has the
    address ``addresses[i]`` (and, with ``network == "namespace"``, the network namespace ``namespaces[i]``); ranks
    fill the hosts in order, ``processes_per_host`` each. ``run_settings`` are the master's hora run settings
    (setting name -> value), ``mpi_exports`` the variables every rank gets (``custom_mpi_options``' ``-x``)."""

    job_name: str
    home: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    network: str
    namespaces: tuple[str, ...]
    interface: str
    master_timeout: float
    connect_timeout: float
    grace: float
    run_settings: Mapping[str, Any]
    mpi_exports: Mapping[str, str]
    processes_per_host: int
    command: tuple[str, ...]
    python: str
    strategy: str
    parameter_server: ParameterServerPlan | None
    metric_definitions: tuple[MetricDefinition, ...]
    echo: bool
    #: seconds between two system metric samples on each host (profiler_config); None: not sampled
    system_monitor_interval: float | None = None

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.processes_per_host

    def host_index(self, host: str) -> int:
        """The index of ``host`` among the job's hosts (algo-1 is 0)."""
        try:
            return self.hosts.index(host)
        except ValueError:
            raise StorageError(
                f"the job {self.job_name} has no host {host!r}; its hosts are {', '.join(self.hosts)}"
            ) from None

    def host_of_rank(self, rank: int) -> str:
        """The host ``rank`` runs on: ranks fill hosts in order (as mpirun's by-slot map)."""
        if not 0 <= rank < self.world_size:
            raise StorageError(f"the job {self.job_name} has ranks 0..{self.world_size - 1}, not rank {rank}")
        return self.hosts[rank // self.processes_per_host]

    # -- the one writer ----------------------------------------------------------------------------------------
    def to_json(self) -> str:
        data = {
            "job_name": self.job_name,
            "home": self.home,
            "hosts": list(self.hosts),
            "addresses": list(self.addresses),
            "network": self.network,
            "namespaces": list(self.namespaces),
            "interface": self.interface,
            "master_timeout": self.master_timeout,
            "connect_timeout": self.connect_timeout,
            "grace": self.grace,
            "run_settings": dict(self.run_settings),
            "mpi_exports": dict(self.mpi_exports),
            "processes_per_host": self.processes_per_host,
            "command": list(self.command),
            "python": self.python,
            "strategy": self.strategy,
            "parameter_server": None if self.parameter_server is None else self.parameter_server.to_dict(),
            "metric_definitions": [{"Name": m.name, "Regex": m.regex} for m in self.metric_definitions],
            "echo": self.echo,
            "system_monitor_interval": self.system_monitor_interval,
        }
        return json.dumps(data, indent=1)

    def write(self, job_dir: str | os.PathLike[str]) -> None:
        """Write the plan to the job directory, readable by the job's user only."""
        write_private(plan_path(job_dir), self.to_json())

    # -- the one reader ----------------------------------------------------------------------------------------
    @classmethod
    def from_json(cls, text: str, source: str = "the job's plan") -> JobPlan:
        """The plan in ``text``.

        Raises:
            StorageError: ``text`` is not a plan hora wrote; the message names ``source`` and the first field that
                is missing or wrong.
        """
        try:
            return cls._from_data(json.loads(text))
        except ValueError as exc:  # a json.JSONDecodeError, or a wrong field
            raise StorageError(
                f"{source} is not a plan hora wrote ({exc}); hora job writes it when the job starts: start the job "
                "again (hora job run) rather than editing it"
            ) from None

    @classmethod
    def read(cls, job_dir: str | os.PathLike[str]) -> JobPlan:
        """The plan in the job directory (OSError when there is none yet)."""
        path = plan_path(job_dir)
        return cls.from_json(path.read_text(), str(path))

    @classmethod
    def _from_data(cls, data: Any) -> JobPlan:
        f = Fields(data, "the plan")
        hosts = f.strings("hosts")
        addresses = f.strings("addresses")
        network = f.choice("network", NETWORKS)
        namespaces = f.strings("namespaces")
        if not hosts:
            raise ValueError("field 'hosts' is empty; a job has at least one host")
        if len(addresses) != len(hosts):
            raise ValueError(f"{len(addresses)} address(es) for {len(hosts)} host(s)")
        if network == "namespace" and len(namespaces) != len(hosts):
            raise ValueError(f"{len(namespaces)} network namespace(s) for {len(hosts)} host(s)")
        command = f.strings("command")
        if not command:
            raise ValueError("field 'command' is empty")
        pph = f.integer("processes_per_host")
        if pph < 1:
            raise ValueError(f"field 'processes_per_host' is {pph}; it must be at least 1")
        return cls(
            job_name=f.string("job_name"),
            home=f.string("home"),
            hosts=hosts,
            addresses=addresses,
            network=network,
            namespaces=namespaces,
            interface=f.string("interface"),
            master_timeout=f.number("master_timeout"),
            connect_timeout=f.number("connect_timeout"),
            grace=f.number("grace"),
            run_settings=f.mapping("run_settings"),
            mpi_exports=f.string_map("mpi_exports"),
            processes_per_host=pph,
            command=command,
            python=f.string("python"),
            strategy=f.string("strategy"),
            parameter_server=_servers(data.get("parameter_server"), len(hosts)),
            metric_definitions=_metrics(f.items("metric_definitions")),
            echo=f.boolean("echo"),
            system_monitor_interval=_interval(data.get("system_monitor_interval")),
        )


def _servers(data: Any, host_count: int) -> ParameterServerPlan | None:
    if data is None:
        return None
    f = Fields(data, "the plan", "parameter_server.")
    servers = f.choice("servers", PS_SERVERS)
    if servers == "hora":
        return ParameterServerPlan(servers)
    workers, ps = f.strings("worker_addresses"), f.strings("ps_addresses")
    if len(workers) != host_count or len(ps) != host_count:
        raise ValueError(
            f"field 'parameter_server' has {len(workers)} worker and {len(ps)} ps address(es) for "
            f"{host_count} host(s); it needs one of each per host"
        )
    return ParameterServerPlan(servers, workers, ps)


def _interval(value: Any) -> float | None:
    """The sampling interval (absent in a plan from before system metrics: not sampled)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"field 'system_monitor_interval' is {value!r}; it must be a number of seconds > 0 or null")
    return float(value)


def _metrics(items: list[Any]) -> tuple[MetricDefinition, ...]:
    out = []
    for i, item in enumerate(items):
        f = Fields(item, "the plan", f"metric_definitions[{i}].")
        out.append(MetricDefinition(f.string("Name"), f.string("Regex")))
    return tuple(out)
