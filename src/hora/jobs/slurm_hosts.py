"""A job inside a Slurm allocation (``hora job run --slurm``, the spec's ``cluster: {slurm: true}``): the
allocation's nodes become algo-1..N, and everything a host runs (its set-up, shipping, Pipe feeders, hora run's
agent, the pull of its results, ``hora job clean``) starts there as a job step of the allocation with srun
(:mod:`hora.jobs._srun_rsh`), where the SSH hosts backend (:mod:`hora.jobs.remote_hosts`) would use ssh.

Like ``hora run`` (:func:`hora.runner.allocation.slurm_allocation`), it takes the nodes from ``SLURM_JOB_NODELIST``
in a ``salloc`` shell or an ``sbatch`` script, and not inside a job step (``srun``: ``SLURM_STEP_ID``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

from hora.errors import ConfigError
from hora.jobs.remote_spec import ClusterSpec
from hora.runner.allocation import expand_hostlist

__all__ = ["SRUN_START_SECONDS", "allocation_cluster", "srun_agent"]

#: Seconds a host check through srun may take (a step is created by the controller, then started by the node's
#: slurmd: slower than an SSH login on a busy cluster).
SRUN_START_SECONDS = 30.0


def _how(n: int | None, command: str) -> str:
    count = str(n) if n else "N"
    return (f"run it under salloc -N {count} (salloc -N {count} {command}) or in an sbatch script (#SBATCH -N "
            f"{count}, then {command}); each node of the allocation is one host algo-K")


def allocation_cluster(cluster: ClusterSpec | None, env: Mapping[str, str], instance_count: int | None,
                       command: str = "hora job run SPEC --slurm") -> ClusterSpec:
    """The spec's cluster (or a default one) on the first ``instance_count`` nodes of the Slurm allocation ``env``
    belongs to (every node when ``instance_count`` is None: ``hora job clean``), with its job id. ``command``: what
    the user runs, for the messages.

    Raises:
        ConfigError: not inside an allocation, inside a job step, or fewer nodes than ``instance_count``.
    """
    if cluster is not None and not cluster.slurm:  # the spec's cluster, with --slurm
        given = [f"cluster.{k}" for k in ("hosts", "ssh_port", "ssh_identity_file", "ssh_options")
                 if getattr(cluster, k) not in (None, ())]
        if given:
            raise ConfigError(f"--slurm takes the hosts from the Slurm allocation and reaches them with srun, but the "
                              f"spec's cluster has {', '.join(given)}: remove them from the spec, or leave out "
                              "--slurm to run over SSH")
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist_var = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), None)
    if not job_id or nodelist_var is None:
        raise ConfigError("hora job --slurm runs inside a Slurm allocation and this is not one (SLURM_JOB_ID and "
                          f"SLURM_JOB_NODELIST are not set): {_how(instance_count, command)}")
    if env.get("SLURM_STEP_ID"):
        raise ConfigError(f"hora job --slurm is running inside a job step (srun; SLURM_STEP_ID={env['SLURM_STEP_ID']}"
                          f" of Slurm job {job_id}): it starts a step on each node itself; "
                          f"{_how(instance_count, command)}, not under srun")
    nodes = expand_hostlist(env[nodelist_var], nodelist_var)
    if instance_count is not None and len(nodes) < instance_count:
        raise ConfigError(
            f"the Slurm allocation (job {job_id}, {nodelist_var}={env[nodelist_var]}) has {len(nodes)} node(s) but "
            f"the spec's instance_count is {instance_count}: each host algo-K is one node; allocate "
            f"{instance_count} node(s) (salloc -N {instance_count}, #SBATCH -N {instance_count}) or set "
            f"instance_count: {len(nodes)}")
    chosen = tuple(nodes[:instance_count] if instance_count is not None else nodes)
    base = cluster if cluster is not None else ClusterSpec(())
    return dataclasses.replace(base, hosts=chosen, backend="slurm", slurm_job_id=job_id)


def srun_agent(job_id: str) -> list[str]:
    """What hora run and the SSH hosts backend run in place of ``ssh`` (given the node, then the command)."""
    return [sys.executable, "-m", "hora.jobs._srun_rsh", job_id]
