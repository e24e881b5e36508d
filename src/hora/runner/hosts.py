"""Parsing ``-H host:slots,...`` and checking it against ``-np``."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from hora.errors import ConfigError

__all__ = ["HostSlots", "is_local_host", "parse_hosts"]


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


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


def is_local_host(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    return host in names
