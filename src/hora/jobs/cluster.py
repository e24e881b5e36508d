"""The local cluster's hosts: their names, their addresses, and which rank runs on which host.

This is the one place that maps a host to an address. Every host is a directory and a set of processes on this
machine; host K (algo-K) gets the loopback address 127.0.0.K, where its ranks bind and advertise their servers
(``HORA_BIND_ADDR``), so traffic between hosts really goes between distinct addresses. Where 127.0.0.K cannot be
bound (not Linux), every host shares 127.0.0.1. Network namespaces per host, and names algo-K that resolve, come
with the multi-host launcher; only this module changes then.
"""

from __future__ import annotations

import functools
import socket

__all__ = ["NETWORK_INTERFACE", "host_address", "host_addresses", "host_index_of_rank", "host_name", "host_names"]

#: What SM_NETWORK_INTERFACE_NAME / resourceconfig.json name: the interface the hosts talk over.
NETWORK_INTERFACE = "lo"


def host_name(index: int) -> str:
    """``algo-1`` for index 0, as SageMaker names its instances."""
    return f"algo-{index + 1}"


def host_names(count: int) -> list[str]:
    return [host_name(i) for i in range(count)]


@functools.lru_cache(maxsize=1)
def _loopback_aliases() -> bool:
    """Whether 127.0.0.2 and friends can be bound here (Linux routes all of 127/8 to lo)."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return True
    except OSError:
        return False


def host_address(index: int) -> str:
    """The address host ``index`` (0 for algo-1) binds and advertises."""
    if index >= 254:
        raise ValueError(f"a local cluster has at most 254 hosts, got host index {index}")
    return f"127.0.0.{index + 1}" if _loopback_aliases() else "127.0.0.1"


def host_addresses(count: int) -> list[str]:
    return [host_address(i) for i in range(count)]


def host_index_of_rank(rank: int, processes_per_host: int) -> int:
    """Ranks fill hosts in order: ranks 0..p-1 on algo-1, p..2p-1 on algo-2, ... (as mpirun's by-slot map)."""
    return rank // processes_per_host
