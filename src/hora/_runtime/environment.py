"""Which launcher started this process, and the rank/size it assigned.

Detection order (first match wins; documented in docs/launchers.md):

1. ``hora run``       — ``HORA_RANK`` / ``HORA_SIZE`` (and local/cross variables)
2. Open MPI ``mpirun`` — ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE`` / ``OMPI_COMM_WORLD_LOCAL_*``
3. torchrun           — ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` / ``MASTER_ADDR``
4. Slurm ``srun``     — ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` / ``SLURM_NODEID`` inside a job step
5. nothing            — a single process (rank 0 of 1)

mpirun inside a Slurm allocation exports both Open MPI's and Slurm's variables; the process's own launcher (the
inner one) is the one that assigned its rank, hence Open MPI and torchrun before Slurm.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hora.errors import ConfigError

__all__ = ["LaunchInfo", "detect"]


@dataclass(frozen=True)
class LaunchInfo:
    """What the launcher told this process. Local/cross values are hints checked against the rendezvous."""

    source: str
    rank: int
    size: int
    local_rank: int | None = None
    local_size: int | None = None
    job_key: str = ""
    master_addr: str = ""


def _int(env: Mapping[str, str], name: str, source: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{name}={text!r} is not a whole number ({source} sets it to the process's rank/size)"
        ) from None


def _opt_int(env: Mapping[str, str], name: str, source: str) -> int | None:
    return _int(env, name, source) if env.get(name, "") != "" else None


def _pair(env: Mapping[str, str], rank_var: str, size_var: str, source: str) -> tuple[int, int]:
    missing = [v for v in (rank_var, size_var) if env.get(v, "") == ""]
    if missing:
        present = rank_var if rank_var not in missing else size_var
        raise ConfigError(
            f"{present} is set but {', '.join(missing)} is not: the {source} variables are incomplete. Start the "
            f"script with its launcher (e.g. 'hora run -np 4 python train.py') or unset {present}."
        )
    rank, size = _int(env, rank_var, source), _int(env, size_var, source)
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"{rank_var}={rank} and {size_var}={size} are inconsistent: need 0 <= rank < size.")
    return rank, size


def _check_local(local_rank: int | None, local_size: int | None, names: tuple[str, str], size: int) -> None:
    if local_rank is None or local_size is None:
        return
    if local_size < 1 or not 0 <= local_rank < local_size or local_size > size:
        raise ConfigError(
            f"{names[0]}={local_rank} and {names[1]}={local_size} are inconsistent: need 0 <= local rank < local size <= size ({size})."
        )


def detect(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read rank and size from the environment of whichever launcher started this process."""
    env = os.environ if env is None else env
    if env.get("HORA_RANK", "") != "" or env.get("HORA_SIZE", "") != "":
        rank, size = _pair(env, "HORA_RANK", "HORA_SIZE", "hora")
        lr, ls = _opt_int(env, "HORA_LOCAL_RANK", "hora"), _opt_int(env, "HORA_LOCAL_SIZE", "hora")
        _check_local(lr, ls, ("HORA_LOCAL_RANK", "HORA_LOCAL_SIZE"), size)
        return LaunchInfo("hora", rank, size, lr, ls, job_key=env.get("HORA_JOB_ID", ""))
    if env.get("OMPI_COMM_WORLD_RANK", "") != "" or env.get("OMPI_COMM_WORLD_SIZE", "") != "":
        rank, size = _pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI")
        lr = _opt_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI")
        ls = _opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI")
        _check_local(lr, ls, ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"), size)
        key = (
            env.get("PMIX_NAMESPACE")
            or env.get("OMPI_MCA_ess_base_jobid")
            or env.get("OMPI_MCA_orte_hnp_uri", "")
        )
        return LaunchInfo("openmpi", rank, size, lr, ls, job_key=f"ompi:{key}" if key else "")
    if env.get("RANK", "") != "" or env.get("WORLD_SIZE", "") != "":
        rank, size = _pair(env, "RANK", "WORLD_SIZE", "torchrun")
        lr, ls = _opt_int(env, "LOCAL_RANK", "torchrun"), _opt_int(env, "LOCAL_WORLD_SIZE", "torchrun")
        _check_local(lr, ls, ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), size)
        master = env.get("MASTER_ADDR", "")
        parts = [
            env.get("TORCHELASTIC_RUN_ID", ""),
            master,
            env.get("MASTER_PORT", ""),
            env.get("TORCHELASTIC_RESTART_COUNT", "0"),
        ]
        key = "torchrun:" + ":".join(parts) if any(parts[:3]) else ""
        return LaunchInfo("torchrun", rank, size, lr, ls, job_key=key, master_addr=master)
    if env.get("SLURM_STEP_ID", "") != "" and env.get("SLURM_PROCID", "") != "":
        rank, size = _pair(env, "SLURM_PROCID", "SLURM_NTASKS", "Slurm")
        lr = _opt_int(env, "SLURM_LOCALID", "Slurm")
        ls = None
        per_node = env.get("SLURM_TASKS_PER_NODE", "")
        if (
            per_node.isdigit()
        ):  # homogeneous "4"; heterogeneous forms like "2(x3),1" leave it to the rendezvous
            ls = int(per_node)
        _check_local(lr, ls, ("SLURM_LOCALID", "SLURM_TASKS_PER_NODE"), size)
        key = f"slurm:{env.get('SLURM_JOB_ID', '')}.{env['SLURM_STEP_ID']}"
        return LaunchInfo("slurm", rank, size, lr, ls, job_key=key)
    return LaunchInfo("none", 0, 1, 0, 1)
