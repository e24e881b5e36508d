"""Which launcher started this process, and the rank/size it assigned.

Launchers nest (``mpirun`` inside a Slurm allocation, ``torchrun`` inside ``srun``, a launcher inside ``hora run``)
and every one of them leaves its variables to whatever runs inside it, so a process can see several launchers'
variables at once. The rule (documented in docs/launchers.md): **the innermost launcher wins**, i.e. the one that
started this very process, recognised like this (first match wins):

1. Open MPI ``mpirun`` — ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE`` (+ ``..._LOCAL_*``). mpirun sets them for
   exactly the processes it starts; ``hora run`` removes them from its workers, so next to ``HORA_*`` they come from
   an mpirun started inside hora run.
2. torchrun, when it was started inside another launcher — ``RANK`` / ``WORLD_SIZE`` with ``TORCHELASTIC_RUN_ID``
   (which ``hora run`` removes from its workers), or ``RANK`` / ``WORLD_SIZE`` that differ from ``HORA_RANK`` /
   ``HORA_SIZE`` (hora run exports them equal to its own).
3. Slurm ``srun`` — ``SLURM_PROCID`` / ``SLURM_NTASKS`` inside a job step (``SLURM_STEP_ID`` set). ``hora run``
   removes the step variables from its workers, so next to ``HORA_*`` they come from an srun started inside it.
   Incomplete torchrun variables here are a batch script's exports for torch.distributed and are ignored; complete
   ones that contradict Slurm's without a torchrun having set them are an error (not a guess).
4. ``hora run``       — ``HORA_RANK`` / ``HORA_SIZE`` (and local/cross variables)
5. torchrun           — ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` / ``MASTER_ADDR``
6. nothing            — a single process (rank 0 of 1)

A Slurm batch script (no ``SLURM_STEP_ID``) is one process, not ``SLURM_NTASKS`` of them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from hora.errors import ConfigError

__all__ = ["LAUNCHER_VARIABLES", "LaunchInfo", "detect", "elastic", "without_launcher_variables"]

#: What other launchers set for each process they start. ``hora run`` removes these from its workers' environment
#: (it sets its own), so a worker that finds one of them knows a launcher started inside hora run set it.
LAUNCHER_VARIABLES = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_NODE_RANK",
    "PMIX_RANK",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_GTIDS",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
)
_LAUNCHER_PREFIXES = ("TORCHELASTIC_",)


def without_launcher_variables(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the per-process variables of other launchers (see :data:`LAUNCHER_VARIABLES`)."""
    return {k: v for k, v in env.items() if k not in LAUNCHER_VARIABLES and not k.startswith(_LAUNCHER_PREFIXES)}


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
    multi_host: bool = (
        False  # the launcher says the ranks span several hosts (rank 0 must listen on a routable address)
    )
    #: another launcher started this process inside a ``hora run`` worker: the outer job's HORA_* settings
    #: (rendezvous, secret, job id, host name) are stale here
    inside_hora_run: bool = False


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
            f"{names[0]}={local_rank} and {names[1]}={local_size} are inconsistent: "
            f"need 0 <= local rank < local size <= size ({size})."
        )


def _set(env: Mapping[str, str], *names: str) -> bool:
    return any(env.get(n, "") != "" for n in names)


def _hora(env: Mapping[str, str]) -> LaunchInfo:
    rank, size = _pair(env, "HORA_RANK", "HORA_SIZE", "hora")
    lr, ls = _opt_int(env, "HORA_LOCAL_RANK", "hora"), _opt_int(env, "HORA_LOCAL_SIZE", "hora")
    _check_local(lr, ls, ("HORA_LOCAL_RANK", "HORA_LOCAL_SIZE"), size)
    return LaunchInfo("hora", rank, size, lr, ls, job_key=env.get("HORA_JOB_ID", ""))


def _open_mpi(env: Mapping[str, str]) -> LaunchInfo:
    rank, size = _pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI")
    lr = _opt_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI")
    ls = _opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI")
    _check_local(lr, ls, ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"), size)
    key = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or env.get("OMPI_MCA_orte_hnp_uri", "")
    multi = ls is not None and ls < size
    return LaunchInfo("openmpi", rank, size, lr, ls, job_key=f"ompi:{key}" if key else "", multi_host=multi)


def _torchrun(env: Mapping[str, str]) -> LaunchInfo:
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
    multi = ls is not None and ls < size
    return LaunchInfo("torchrun", rank, size, lr, ls, job_key=key, master_addr=master, multi_host=multi)


def _slurm(env: Mapping[str, str]) -> LaunchInfo:
    rank, size = _pair(env, "SLURM_PROCID", "SLURM_NTASKS", "Slurm")
    lr = _opt_int(env, "SLURM_LOCALID", "Slurm")
    ls = None
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    if per_node.isdigit():  # homogeneous "4"; heterogeneous forms like "2(x3),1" leave it to the rendezvous
        ls = int(per_node)
    _check_local(lr, ls, ("SLURM_LOCALID", "SLURM_TASKS_PER_NODE"), size)
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES", "")
    multi = (nodes.isdigit() and int(nodes) > 1) or (ls is not None and ls < size)
    key = f"slurm:{env.get('SLURM_JOB_ID', '')}.{env['SLURM_STEP_ID']}"
    return LaunchInfo("slurm", rank, size, lr, ls, job_key=key, multi_host=multi)


def detect(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read rank and size from the environment of the innermost launcher (see the module's docstring)."""
    env = os.environ if env is None else env
    info = _detect(env)
    if info.source not in ("hora", "none") and _set(env, "HORA_RANK"):
        info = dataclasses.replace(info, inside_hora_run=True)
    return info


def elastic(env: Mapping[str, str] | None = None) -> bool:
    """Whether an elastic launcher started this process (``HOROVOD_ELASTIC=1``, the variable Horovod's sets)."""
    env = os.environ if env is None else env
    return env.get("HOROVOD_ELASTIC") == "1"


def _detect(env: Mapping[str, str]) -> LaunchInfo:
    hora = _set(env, "HORA_RANK", "HORA_SIZE")
    torch_vars = _set(env, "RANK", "WORLD_SIZE")
    if _set(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        return _open_mpi(env)
    # hora run exports RANK/WORLD_SIZE equal to HORA_RANK/HORA_SIZE: equal ones are its own, not a nested torchrun's.
    hora_own = hora and (env.get("RANK"), env.get("WORLD_SIZE")) == (env.get("HORA_RANK"), env.get("HORA_SIZE"))
    if torch_vars and _set(env, "TORCHELASTIC_RUN_ID"):
        return _torchrun(env)
    if torch_vars and hora and not hora_own:
        _hora(env)  # the comparison only means something if HORA_* are complete: a broken set is reported as such
        return _torchrun(env)
    if _set(env, "SLURM_STEP_ID") and _set(env, "SLURM_PROCID"):
        info = _slurm(env)
        complete = _set(env, "RANK") and _set(env, "WORLD_SIZE")
        if complete and not hora_own and (env["RANK"], env["WORLD_SIZE"]) != (str(info.rank), str(info.size)):
            raise ConfigError(
                f"RANK={env['RANK']} and WORLD_SIZE={env['WORLD_SIZE']} contradict this Slurm job step's "
                f"SLURM_PROCID={info.rank} and SLURM_NTASKS={info.size}, and no torchrun set them "
                "(TORCHELASTIC_RUN_ID is unset): probably a batch script exported them once for every task. "
                "Unset RANK and WORLD_SIZE (hora reads Slurm's variables), or set them per task "
                "(srun bash -c 'RANK=$SLURM_PROCID ...')."
            )
        return info
    if hora:
        return _hora(env)
    if torch_vars:
        return _torchrun(env)
    return LaunchInfo("none", 0, 1, 0, 1)
