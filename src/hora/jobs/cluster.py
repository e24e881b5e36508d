"""The local cluster's hosts: their names, their addresses, and which rank runs on which host.

Every host ``algo-K`` is a directory and a process tree on this machine (:mod:`hora.jobs._host`), with an address
of its own where its ranks bind and advertise their servers (``HORA_BIND_ADDR``), so traffic between hosts really
goes between distinct addresses. How the hosts get their addresses is the spec's ``network``:

- ``namespace``: a network namespace per host (:mod:`hora.jobs.netns`), interface ``eth0``, ``10.X.Y.K``;
- ``loopback``: host K binds ``127.0.0.K`` on ``lo`` (all hosts share ``127.0.0.1`` where 127.0.0.K cannot be
  bound, i.e. not on Linux);
- ``auto`` (the default): ``namespace`` when this process may create namespaces (root, iproute2), else ``loopback``.

Names: run as root on Linux, each host's process tree also lives in a private mount and UTS namespace
(:func:`enter_host`) where ``/etc/hosts`` lists ``algo-K`` with its address and the host name is ``algo-K``, as in a
SageMaker container, so code that resolves ``SM_HOSTS`` entries or compares ``socket.gethostname()`` with
``SM_CURRENT_HOST`` works. Without root the names do not resolve (documented in docs/jobs.md).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import socket
import tempfile
from pathlib import Path

__all__ = [
    "LOOPBACK_INTERFACE",
    "enter_host",
    "host_address",
    "host_addresses",
    "host_index_of_rank",
    "host_name",
    "host_names",
    "hosts_file_text",
    "read_secret",
    "resolve_network",
    "runtime_dir",
    "socket_path",
]

#: What SM_NETWORK_INTERFACE_NAME / resourceconfig.json name with ``network: loopback``.
LOOPBACK_INTERFACE = "lo"


def resolve_network(choice: str) -> str:
    """``namespace`` or ``loopback`` for the spec's ``network`` (``auto`` picks namespaces where they can be made)."""
    if choice != "auto":
        return choice
    from hora.jobs import netns

    return "loopback" if netns.unavailable() else "namespace"


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


def hosts_file_text(base: str, addresses: list[str]) -> str:
    """``/etc/hosts`` as the job's hosts see it: this machine's, plus one line per host."""
    lines = [base.rstrip("\n"), "# the hosts of this hora job"]
    lines += [f"{addr}\t{name}" for addr, name in zip(addresses, host_names(len(addresses)))]
    return "\n".join(lines) + "\n"


def runtime_dir(job_dir: str | os.PathLike[str]) -> Path:
    """A short private directory for the hosts' sockets (a job directory can be too long for a socket path)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(job_dir))).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"hora-{os.getuid()}-{digest}"


def socket_path(job_dir: str | os.PathLike[str], host: str) -> Path:
    return runtime_dir(job_dir) / f"{host}.sock"


def read_secret(job_dir: str | os.PathLike[str]) -> bytes:
    return bytes.fromhex(Path(job_dir, "hora", "secret").read_text().strip())


_CLONE_NEWNS, _CLONE_NEWUTS = 0x00020000, 0x04000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


OPT_ML = Path("/opt/ml")


def enter_host(name: str, hosts_file: Path, root: Path | None = None) -> bool:
    """Make this process (and what it starts) see ``hosts_file`` as /etc/hosts, ``name`` as its host name and, with
    ``root``, the host's tree at ``/opt/ml`` (for scripts that hard-code SageMaker's paths).

    Needs root (CAP_SYS_ADMIN) and must run before any thread starts; returns False, changing nothing, otherwise.
    The mounts are private to the new namespace: the machine's /etc/hosts and /opt/ml are untouched (an empty
    /opt/ml directory is created as the mount point where there is none).
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
    if root is not None:
        try:
            OPT_ML.mkdir(parents=True, exist_ok=True)
        except OSError:
            return True
        libc.mount(os.fsencode(root), os.fsencode(OPT_ML), None, _MS_BIND, None)
    return True
