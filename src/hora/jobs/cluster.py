"""The local cluster's hosts: their names, their addresses, and which rank runs on which host.

This is the one place that maps a host to an address. Today every host is a directory and a set of processes on
this machine, all reached at 127.0.0.1 through the loopback interface; distinct loopback addresses (127.0.0.x)
or network namespaces per host come with the multi-host launcher, and only this module changes then.
"""

from __future__ import annotations

__all__ = ["NETWORK_INTERFACE", "host_address", "host_index_of_rank", "host_name", "host_names"]

#: What SM_NETWORK_INTERFACE_NAME / resourceconfig.json name: the interface the hosts talk over.
NETWORK_INTERFACE = "lo"


def host_name(index: int) -> str:
    """``algo-1`` for index 0, as SageMaker names its instances."""
    return f"algo-{index + 1}"


def host_names(count: int) -> list[str]:
    return [host_name(i) for i in range(count)]


def host_address(index: int) -> str:
    """The address host ``index`` listens on. All hosts share 127.0.0.1 until per-host addresses land."""
    return "127.0.0.1"


def host_index_of_rank(rank: int, processes_per_host: int) -> int:
    """Ranks fill hosts in order: ranks 0..p-1 on algo-1, p..2p-1 on algo-2, ... (as mpirun's by-slot map)."""
    return rank // processes_per_host
