"""What one launch of ``hora run`` is asked to do: the command, the ranks and hosts, and how to run them.

:func:`hora.runner.launch.launch` carries it out; ``hora run`` (:func:`hora.runner.run_command`) and each ``hora
job`` host's master fill it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hora.runner.hosts import HostSlots
from hora.runner.observer import RunObserver
from hora.runner.ssh import SshOptions

__all__ = ["LaunchSpec"]


@dataclass
class LaunchSpec:
    command: Sequence[str]
    np: int
    hostname: str = "localhost"
    env: Mapping[str, str] | None = None
    settings: Mapping[str, object] = field(default_factory=dict)
    output_filename: str | None = None
    capture: bool = False
    prefix_output: bool = True
    verbose: bool = False
    grace: float = 3.0
    timeout: float | None = None
    cwd: str | None = None
    rendezvous_port: int = 0
    hosts: Sequence[HostSlots] | None = None  # None: every rank on this machine, as ``hostname``
    ssh: SshOptions | None = None
    network_interface: str | None = None
    start_timeout: float = 30.0
    local_hosts: Sequence[str] = ()  # host names that are this machine whatever they resolve to (hora job's algo-1)
    #: every host through ``ssh``/the agent, this machine's own name too (hora job in a Slurm allocation: each host's
    #: processes are a job step, started with srun on whichever node the launcher runs)
    remote_only: bool = False
    #: where hosts are whose names the network does not know (hora job's Ray nodes, named by node id; nodes of one
    #: machine share an address): their addresses, for the route to them and MASTER_ADDR. Such a host is remote.
    host_addresses: Mapping[str, str] = field(default_factory=dict)
    oversubscribe: bool = False  # allow more than MAX_PER_CPU processes per CPU here (the oversubscribe setting)
    merge_stderr: bool = False  # one pipe for each process's stdout and stderr (the merge_stderr setting)
    observer: RunObserver | None = None  # told of the ranks, their lines and the end (hora run --record)
    quiet: bool = False  # print no rank output (the observer still gets it: hora job on remote hosts, echo off)
    system_metrics: str | None = None  # append every host's system metrics here (the system_metrics setting)
    system_metrics_interval: float = 0.5
