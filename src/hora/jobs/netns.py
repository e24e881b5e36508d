"""Network namespaces for a job's hosts: each host ``algo-K`` gets a network of its own, like an instance.

Built as root with ``ip`` (iproute2), for one job:

- a bridge ``hjb<pid>`` in this machine's namespace, with the gateway address ``10.X.Y.254/24``;
- one namespace ``hj<pid>.<start>-algo-K`` per host, joined to the bridge by a veth pair whose inner end is named
  ``eth0`` (SageMaker's ``SM_NETWORK_INTERFACE_NAME``) and carries ``10.X.Y.K/24``, with ``lo`` up and a default
  route through the gateway, so the host reaches services that listen on this machine's other addresses.

``<pid>`` and ``<start>`` are the supervisor's process id and start time: :func:`sweep` removes what a supervisor
that died without cleaning up left behind. Hosts reach each other only over the bridge; reaching further (the
internet) needs IP forwarding and NAT, which hora does not configure on the machine (use ``network: loopback`` for
such scripts).
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from hora._proc import process_alive, process_start_time
from hora.errors import HoraError
from hora.runner.reaper import GroupReaper

__all__ = ["HostNetwork", "create", "enter", "free_subnet", "sweep", "unavailable"]

INTERFACE = "eth0"
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^hj(\d+)\.(\d+)-algo-\d+$")


def _ip(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.CalledProcessError as exc:
        raise HoraError(f"'ip {' '.join(args)}' failed: {exc.stderr.strip() or exc.returncode}") from None
    except subprocess.TimeoutExpired:
        raise HoraError(f"'ip {' '.join(args)}' did not finish within {timeout:g}s") from None


def unavailable() -> str:
    """Why network namespaces cannot be made here ('' when they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "'ip' (iproute2) is not installed"
    probe = f"hj{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except HoraError as exc:
        return str(exc)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return ""


@dataclass
class HostNetwork:
    """The job's namespaces, bridge and addresses (``namespaces[k]`` and ``addresses[k]`` belong to host k)."""

    bridge: str
    gateway: str
    namespaces: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    # deletes them should this process be killed before remove() (SIGKILL included): they would stay until the next
    # job's sweep otherwise
    reaper: GroupReaper = field(default_factory=GroupReaper)

    def remove(self) -> None:
        """Delete the namespaces (their veth ends go with them) and the bridge; never raises."""
        for name in self.namespaces:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        for link in [*self.links, self.bridge]:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=20)
        self.reaper.close()


def free_subnet() -> str:
    """A 10.x.y prefix whose /24 no address or route of this machine uses."""
    used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
    for _ in range(200):
        prefix = f"10.{random.randint(16, 250)}.{random.randint(0, 255)}"
        if f"{prefix}." not in used:
            return prefix
    raise HoraError("no free 10.x.y.0/24 subnet for the job's hosts")


def create(count: int) -> HostNetwork:
    """Build the hosts' namespaces (see the module docstring); on any failure, remove what was built and raise."""
    if count > 253:
        raise HoraError(f"a job has at most 253 hosts in network namespaces, got {count}")
    owner = os.getpid()
    start = process_start_time(owner)
    prefix = free_subnet()
    net = HostNetwork(bridge=f"hjb{owner}", gateway=f"{prefix}.254")
    try:
        net.reaper.run_on_death(["ip", "link", "del", net.bridge])
        _ip("link", "add", net.bridge, "type", "bridge")
        _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for k in range(1, count + 1):
            name = f"hj{owner}.{start}-algo-{k}"
            addr = f"{prefix}.{k}"
            net.reaper.run_on_death(["ip", "netns", "del", name])
            _ip("netns", "add", name)
            net.namespaces.append(name)
            outer, inner = f"hjv{owner}k{k}", f"hjp{owner}k{k}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            net.links.append(outer)
            _ip("link", "set", outer, "master", net.bridge, "up")
            _ip("link", "set", inner, "netns", name)
            _ip("-n", name, "link", "set", inner, "name", INTERFACE)
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", INTERFACE)
            _ip("-n", name, "link", "set", INTERFACE, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "route", "add", "default", "via", net.gateway)
            net.addresses.append(addr)
    except BaseException:
        net.remove()
        raise
    return net


def enter(name: str) -> None:
    """Move this process into the network namespace ``name`` (before any thread starts; needs root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise HoraError(f"cannot enter network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def sweep() -> list[str]:
    """Remove the namespaces and bridges of job supervisors that are gone; return the names removed."""
    try:
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    removed = []
    owners = set()
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not process_alive(int(m.group(1)), int(m.group(2))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
            removed.append(name)
            owners.add(m.group(1))
    for owner in owners:
        if subprocess.run(["ip", "link", "del", f"hjb{owner}"], capture_output=True, timeout=20).returncode == 0:
            removed.append(f"hjb{owner}")
    return removed
