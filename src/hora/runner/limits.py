"""How many processes one launch may start on one machine: at most :data:`MAX_PER_CPU` per usable CPU (ranks and
parameter servers together) unless the ``oversubscribe`` setting says otherwise — thousands of processes on a few
cores only fight over them, and exhaust the process and descriptor limits first. Used by ``hora run`` (its local
hosts), by each remote host's agent for its own processes, and by ``hora job`` (all of whose hosts are this
machine). The descriptors the launcher needs for them are checked, and the soft limit raised when it can be.
"""

from __future__ import annotations

import resource

from hora._proc import usable_cpus
from hora.errors import ConfigError

__all__ = ["MAX_PER_CPU", "check_process_count", "process_count_problem"]

MAX_PER_CPU = 16
#: Descriptors the launcher holds per local process (its stdout and stderr pipes, a pidfd) and for itself.
_FDS_PER_PROCESS, _FDS_BASE = 3, 64


def process_count_problem(count: int, what: str, oversubscribe: bool, cpus: int | None = None) -> str | None:
    """Why ``count`` processes on this machine are refused (``what`` says who asks), or None."""
    cpus = cpus or usable_cpus()
    if oversubscribe or count <= MAX_PER_CPU * cpus:
        return None
    return (
        f"{what} would start {count} processes on this machine, which has {cpus} usable CPU(s): more than "
        f"{MAX_PER_CPU} per CPU ({MAX_PER_CPU * cpus} here) is refused, since they would only fight over the CPUs. "
        "Lower the count, or allow it with --oversubscribe (HORA_OVERSUBSCRIBE=1) if you mean it."
    )


def check_process_count(count: int, what: str, oversubscribe: bool) -> None:
    """Refuse an absurd ``count`` (:func:`process_count_problem`), then make sure the launcher can hold the
    descriptors ``count`` processes need: raise the soft limit up to the hard one, or say what to raise."""
    problem = process_count_problem(count, what, oversubscribe)
    if problem:
        raise ConfigError(problem)
    need = _FDS_BASE + _FDS_PER_PROCESS * count
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(
                f"{what} needs about {need} open files for {count} processes, but this process may open {hard} "
                f"at most (ulimit -Hn): raise the limit (ulimit -n {need}) or lower the count"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
