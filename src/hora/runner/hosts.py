"""Parsing ``-H host:slots,...`` and hostfiles, and telling this machine's names from other hosts'."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from hora.errors import ConfigError

__all__ = [
    "HostSlots",
    "RankSlot",
    "assign_ranks",
    "is_local_host",
    "parse_hostfile",
    "parse_hosts",
    "place_servers",
]


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


@dataclass(frozen=True)
class RankSlot:
    """Where one rank runs and its place in the topology (what its HORA_* variables say)."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def assign_ranks(np: int, hosts: list[HostSlots]) -> list[RankSlot]:
    """Fill the hosts in order (the first host's slots get ranks 0.., then the next host's), as horovodrun does.

    Hosts left without a rank are dropped. Cross rank/size follow hora's topology: among the hosts that have a
    rank with a given local rank, in host order.
    """
    counts: list[tuple[str, int]] = []
    left = np
    for h in hosts:
        if left <= 0:
            break
        take = min(h.slots, left)
        counts.append((h.host, take))
        left -= take
    out: list[RankSlot] = []
    for host, n in counts:
        for local in range(n):
            cross = [name for name, m in counts if m > local]
            out.append(RankSlot(len(out), host, local, n, cross.index(host), len(cross)))
    return out


def place_servers(num_ps: int, ps_per_host: int, hosts: list[str]) -> list[str]:
    """The host of each parameter server (``--num-ps`` / ``--ps-per-host``), in server order.

    ``hosts`` are the job's hosts that run ranks, in rank order. Server ``i`` runs on host ``i % len(hosts)``:
    with ``ps_per_host`` K every host gets K servers (K x hosts in all, which ``num_ps``, when given, must equal);
    ``num_ps`` S alone spreads S servers over the hosts the same way (the first ``S % hosts`` hosts get one more).

    Raises:
        ConfigError: ``num_ps`` and ``ps_per_host`` disagree.
    """
    if not hosts or (not num_ps and not ps_per_host):
        return []
    if ps_per_host:
        total = ps_per_host * len(hosts)
        if num_ps and num_ps != total:
            raise ConfigError(
                f"--num-ps {num_ps} and --ps-per-host {ps_per_host} disagree: {ps_per_host} server(s) on each of the "
                f"job's {len(hosts)} host(s) ({', '.join(hosts)}) is {total} in all; drop --num-ps (HORA_NUM_PS) "
                f"or make it {total}"
            )
        num_ps = total
    return [hosts[i % len(hosts)] for i in range(num_ps)]


def parse_hosts(text: str) -> list[HostSlots]:
    """``"a:4,b:2"`` -> [HostSlots("a", 4), HostSlots("b", 2)]; a host without ``:slots`` has one slot."""
    out: list[HostSlots] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:slots
            host, _, slots = item[1:].partition("]")
            slots = slots.removeprefix(":") or "1"
        elif item.count(":") > 1:  # a bare IPv6 address has one slot; write [addr]:N for more
            host, slots = item, "1"
        else:
            host, sep, slots = item.rpartition(":")
            if not sep:
                host, slots = item, "1"
        if not host or not (slots.isascii() and slots.isdigit()) or int(slots) < 1:
            raise ConfigError(
                f"-H entry {item!r} is not host:slots with slots >= 1 (e.g. -H localhost:4,node2:4)"
            )
        if any(h.host == host for h in out):
            raise ConfigError(f"-H names host {host!r} twice")
        out.append(HostSlots(host, int(slots)))
    if not out:
        raise ConfigError("-H is empty; give host:slots entries, e.g. -H localhost:4")
    return out


def parse_hostfile(path: str) -> list[HostSlots]:
    """Read an Open MPI / Horovod style hostfile.

    Each line is ``host slots=N`` (``max_slots=`` is accepted and ignored), ``host:N`` or a bare ``host`` (one slot);
    ``#`` starts a comment and blank lines are skipped.
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the hostfile {path!r}: {exc.strerror}") from None
    out: list[HostSlots] = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {path}, line {number} ({raw.strip()!r})"
        host, *fields = line.split()
        slots: str | None = None
        if host.count(":") == 1 and not host.startswith("["):
            host, slots = host.split(":")
        elif host.startswith("[") and "]:" in host:
            host, slots = host[1:].split("]:")
        host = host.strip("[]")
        for item in fields:
            key, sep, value = item.partition("=")
            if key == "slots" and sep:
                slots = value
            elif key == "max_slots" and sep:
                continue
            else:
                raise ConfigError(
                    f"{where}: {item!r} is not understood; write 'host slots=N', 'host:N' or 'host'"
                )
        slots = slots or "1"
        if not host or not (slots.isascii() and slots.isdigit()) or int(slots) < 1:
            raise ConfigError(f"{where}: expected 'host slots=N' with N >= 1")
        if any(h.host == host for h in out):
            raise ConfigError(f"{where}: host {host!r} is listed twice")
        out.append(HostSlots(host, int(slots)))
    if not out:
        raise ConfigError(f"the hostfile {path!r} names no host; write one 'host slots=N' line per host")
    return out


def is_local_host(host: str) -> bool:
    """True for loopback names/addresses, this machine's names, and addresses of this machine's interfaces."""
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    if host in names:
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: resolving it could wait on DNS, and a name of this machine was checked above
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:  # an address can be bound only when one of this machine's interfaces carries it
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False
