"""The local cluster's hosts: their names, their addresses, and which rank runs on which host.

This is the one place that maps a host to an address. Every host is a directory and a set of processes on this
machine; host K (algo-K) gets the loopback address 127.0.0.K, where its ranks bind and advertise their servers
(``HORA_BIND_ADDR``), so traffic between hosts really goes between distinct addresses. Where 127.0.0.K cannot be
bound (not Linux), every host shares 127.0.0.1.

Names: run as root on Linux, each rank's wrapper enters a private mount and UTS namespace (:func:`enter_host`)
where ``/etc/hosts`` also lists ``algo-K -> 127.0.0.K`` and the host name is ``algo-K``, as in a SageMaker
container, so code that resolves ``SM_HOSTS`` entries or compares ``socket.gethostname()`` with
``SM_CURRENT_HOST`` works. Without root the names do not resolve (documented in docs/jobs.md).
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
from pathlib import Path

__all__ = ["NETWORK_INTERFACE", "enter_host", "host_address", "host_addresses", "host_index_of_rank", "host_name", "host_names", "hosts_file_text"]

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


def hosts_file_text(base: str, count: int) -> str:
    """``/etc/hosts`` as the job's hosts see it: this machine's, plus one line per host."""
    lines = [base.rstrip("\n"), "# the hosts of this hora job"]
    lines += [f"{addr}\t{name}" for addr, name in zip(host_addresses(count), host_names(count))]
    return "\n".join(lines) + "\n"


_CLONE_NEWNS, _CLONE_NEWUTS = 0x00020000, 0x04000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def enter_host(name: str, hosts_file: Path) -> bool:
    """Make this process (and what it starts) see ``hosts_file`` as /etc/hosts and ``name`` as its host name.

    Needs root (CAP_SYS_ADMIN) and must run before any thread starts; returns False, changing nothing, otherwise.
    The mount is private to the new namespace: the machine's /etc/hosts is untouched.
    """
    if os.geteuid() != 0 or not hosts_file.is_file():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWUTS) != 0:
        return False
    # mounts made here must not propagate back to the machine's namespace
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    if libc.mount(os.fsencode(hosts_file), b"/etc/hosts", None, _MS_BIND, None) != 0:
        return False
    encoded = name.encode()
    libc.sethostname(encoded, len(encoded))
    return True
