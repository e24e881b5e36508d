"""What ``hora run`` finds around it: a Slurm allocation to take hosts from, or a launcher it must not run inside.

Inside a Slurm allocation (``salloc``, an ``sbatch`` script) with no ``-H``, ``hora run`` takes the hosts and their
slots from ``SLURM_JOB_NODELIST`` and ``SLURM_TASKS_PER_NODE`` (or ``SLURM_JOB_CPUS_PER_NODE``), as ``mpirun`` does.
Inside a job step (``srun``) it does not: the step is already the set of processes Slurm started.

Started as one of several ranks of another launcher (``mpirun -np 4 hora run ...``), every copy would start a job
of its own — a mistake, so it is an error that says what to run instead.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from hora.config.launchers import detect
from hora.errors import ConfigError
from hora.runner.hosts import HostSlots

__all__ = ["Allocation", "check_not_nested", "expand_hostlist", "expand_tasks_per_node", "slurm_allocation"]


@dataclass(frozen=True)
class Allocation:
    """Hosts and slots an existing allocation offers, and where they came from (for messages)."""

    hosts: list[HostSlots]
    source: str

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)


def _split_top(text: str, what: str) -> list[str]:
    """Split at commas outside brackets; brackets must balance and not nest."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"{what}: nested '[' in {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{what}: ']' without '[' in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"{what}: '[' without ']' in {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range(body: str, item: str, what: str) -> list[str]:
    """``01-03,07`` -> ["01", "02", "03", "07"]: the width of the lower bound pads the numbers (Slurm's rule)."""
    out: list[str] = []
    for piece in body.split(","):
        piece = piece.strip()
        lo, sep, hi = piece.partition("-")
        if not (lo.isascii() and lo.isdigit()) or (sep and not (hi.isascii() and hi.isdigit())):
            raise ConfigError(f"{what}: {piece!r} in {item!r} is not a number or a range like 01-04")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ConfigError(f"{what}: range {piece!r} in {item!r} runs backwards")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_hostlist(text: str, what: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Slurm's compressed host list to host names, in order.

    ``node[01-03,07],gpu-a[1-2]-x,single`` -> node01 node02 node03 node07 gpu-a1-x gpu-a2-x single; several bracket
    groups in one name expand to every combination (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2), as Slurm does.
    """
    hosts: list[str] = []
    for item in _split_top(text, what):
        names = [""]
        for literal, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            names = [n + literal for n in names]
            if body:
                names = [n + s for n in names for s in _expand_range(body, item, what)]
        hosts += names
    if not hosts:
        raise ConfigError(f"{what} is empty")
    return hosts


def expand_tasks_per_node(text: str, what: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (Slurm's counts per node; ``N(xR)`` repeats N for R nodes)."""
    out: list[int] = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ConfigError(f"{what}={text!r}: {item!r} is not N or N(xR)")
        out += [int(m[1])] * int(m[2] or 1)
    return out


def slurm_allocation(env: Mapping[str, str]) -> Allocation | None:
    """The hosts and slots of the Slurm allocation this process runs in; ``None`` outside one or inside a step."""
    nodelist_var = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), None)
    if nodelist_var is None or env.get("SLURM_STEP_ID"):
        return None
    hosts = expand_hostlist(env[nodelist_var], nodelist_var)
    count_var = next((v for v in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE") if env.get(v)), None)
    if count_var is None:
        counts = [1] * len(hosts)
        source = f"Slurm allocation {nodelist_var}={env[nodelist_var]} (one slot per node: no SLURM_TASKS_PER_NODE)"
    else:
        counts = expand_tasks_per_node(env[count_var], count_var)
        source = f"Slurm allocation {nodelist_var}={env[nodelist_var]}, {count_var}={env[count_var]}"
        if len(counts) != len(hosts):
            raise ConfigError(
                f"{count_var}={env[count_var]!r} gives {len(counts)} node(s) but {nodelist_var}="
                f"{env[nodelist_var]!r} names {len(hosts)}; give the hosts explicitly with -H host:slots,..."
            )
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"{nodelist_var}={env[nodelist_var]!r} names a host twice")
    # In a batch script Slurm names the node we run on; its Slurm name need not be its host name (NodeHostname=).
    here = env.get("SLURMD_NODENAME", "")
    hosts = [socket.gethostname() if h == here else h for h in hosts]
    return Allocation([HostSlots(h, c) for h, c in zip(hosts, counts) if c > 0], source)


_RUN_INSTEAD = {
    "openmpi": "mpirun -np {n} python train.py",
    "slurm": "srun -n {n} python train.py",
    "torchrun": "torchrun --nproc-per-node ... train.py",
    "hora": "one hora run -np {n} python train.py",
}


def check_not_nested(env: Mapping[str, str]) -> None:
    """Refuse to run as one of several ranks of another launcher (each copy would start a job of its own)."""
    try:
        info = detect(env)
    except ConfigError:
        return  # broken variables of an outer launcher: hora run replaces them for its workers anyway
    if info.size > 1:
        name = {"openmpi": "Open MPI's mpirun", "slurm": "a Slurm job step (srun)", "torchrun": "torchrun",
                "hora": "hora run"}[info.source]
        raise ConfigError(
            f"hora run is running as rank {info.rank} of {info.size} under {name}: each of the {info.size} copies "
            f"would start a job of its own. Start the script with one launcher, either directly under it "
            f"({_RUN_INSTEAD[info.source].format(n=info.size)}) or with hora run alone (hora run -np N python "
            "train.py; inside a Slurm allocation hora run takes the hosts from it)."
        )
