"""Pretend hosts for multi-host tests: Linux network namespaces on one bridge, each with its own ``sshd``.

:func:`start_cluster` builds, with a random tag so parallel runs do not collide:

- a bridge ``hbr<tag>`` in the root namespace with address ``10.X.Y.1/24`` (the launcher runs here);
- ``n_ssh`` namespaces ``hora-<tag>-<i>``, each joined to the bridge by a veth pair whose inner end is *also* named
  ``hbr<tag>`` (so ``--network-interface hbr<tag>`` names the right NIC on every "host"), with address
  ``10.X.Y.<i+1>`` and an ``sshd -D`` listening there, using a throwaway host key and authorizing one throwaway
  client key (:attr:`Cluster.key`; :attr:`Cluster.wrong_key` is not authorized);
- one more namespace, :attr:`Cluster.blackhole`, where a plain Python listener on port 22 accepts connections and
  never says a word;
- :attr:`Cluster.unreachable`, an address on the bridge with nothing behind it.

The namespaces share the file system and the PID space with the root namespace, so the same Python and the same hora
run "remotely", and the test sees every remote process in /proc. :meth:`Cluster.close` kills what it started by pid
and deletes the namespaces and links, even after a failed test. Building it needs root, ``ip netns``, ``sshd``,
``ssh`` and ``ssh-keygen``; :func:`unavailable` says what is missing (tests skip with that reason).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"

_LISTENER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 22), backlog=64)
held = []
while True:
    conn, _ = server.accept()
    held.append(conn)  # accept, never answer, never close
"""


def _run(*argv: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout)


def unavailable() -> str:
    """Why the fixture cannot be built here ('' when it can)."""
    from hora.jobs import netns

    why = netns.unavailable()  # Linux, root, iproute2, and `ip netns add` works
    if why:
        return why
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (.ci/run installs openssh)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (.ci/run installs openssh-server)"
    return ""


@dataclass
class Host:
    netns: str
    addr: str
    pid: int = 0  # sshd's (or the black-hole listener's) pid


@dataclass
class Cluster:
    tag: str
    bridge: str
    root_addr: str
    hosts: list[Host]
    blackhole: Host
    unreachable: str
    directory: Path
    key: str
    wrong_key: str
    known_hosts: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    netns_names: list[str] = field(default_factory=list)

    def ssh_kwargs(self, key: str | None = None) -> dict[str, object]:
        """``run_command``/``run`` keyword arguments that reach the hosts with the authorized key."""
        return {
            "ssh_identity_file": key or self.key,
            "ssh_options": [f"UserKnownHostsFile={self.known_hosts}", "StrictHostKeyChecking=yes"],
        }

    def cli_args(self, key: str | None = None) -> list[str]:
        """The same for the ``hora run`` command line."""
        return [
            "-i",
            key or self.key,
            "--ssh-option",
            f"UserKnownHostsFile={self.known_hosts}",
            "--ssh-option",
            "StrictHostKeyChecking=yes",
        ]

    def netns_inode(self, name: str) -> int:
        return os.stat(f"/run/netns/{name}").st_ino

    def processes_in(self, name: str) -> set[int]:
        """Pids of the processes whose network namespace is ``name`` (the fixture's own sshd included)."""
        ino = self.netns_inode(name)
        out = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.stat(entry / "ns" / "net").st_ino == ino:
                        out.add(int(entry.name))
                except OSError:
                    pass
        return out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name in self.netns_names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=20)
        shutil.rmtree(self.directory, ignore_errors=True)


def _wait_port(addr: str, port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{addr}: the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{addr}:{port} did not start listening within {timeout:g}s: {log.read_text()[-2000:]}")


def start_cluster(n_ssh: int = 2) -> Cluster:
    """Build the hosts (see the module docstring); the caller must :meth:`Cluster.close` it."""
    tag = f"{random.randrange(16**4):04x}"
    from hora.jobs.netns import free_subnet

    prefix = free_subnet()
    directory = Path(tempfile.mkdtemp(prefix=f"hora-netns-{tag}-"))
    bridge = f"hbr{tag}"
    cluster = Cluster(
        tag,
        bridge,
        f"{prefix}.1",
        [],
        Host("", ""),
        f"{prefix}.200",
        directory,
        str(directory / "client_key"),
        str(directory / "wrong_key"),
        str(directory / "known_hosts"),
    )
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{prefix}.1/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        for key in ("host_key", "client_key", "wrong_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hora-test-{key}", "-f", str(directory / key))
        (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
        host_pub = (directory / "host_key.pub").read_text().split()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        known = []
        for i in range(1, n_ssh + 2):
            name = f"hora-{tag}-{i}"
            addr = f"{prefix}.{i + 1}"
            _run("ip", "netns", "add", name)
            cluster.netns_names.append(name)
            outer, inner = f"hv{tag}{i}", f"hp{tag}{i}"
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", outer, "master", bridge, "up")
            _run("ip", "link", "set", inner, "netns", name)
            _run("ip", "-n", name, "link", "set", inner, "name", bridge)
            _run("ip", "-n", name, "addr", "add", f"{addr}/24", "dev", bridge)
            _run("ip", "-n", name, "link", "set", bridge, "up")
            _run("ip", "-n", name, "link", "set", "lo", "up")
            log = directory / f"server-{i}.log"
            if i <= n_ssh:
                config = directory / f"sshd-{i}.conf"
                config.write_text(
                    "\n".join(
                        [
                            f"ListenAddress {addr}",
                            "Port 22",
                            f"HostKey {directory / 'host_key'}",
                            f"PidFile {directory / f'sshd-{i}.pid'}",
                            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                            "PermitRootLogin prohibit-password",
                            "PubkeyAuthentication yes",
                            "PasswordAuthentication no",
                            "KbdInteractiveAuthentication no",
                            "UsePAM no",
                            "StrictModes no",  # the keys live under /tmp
                            "MaxStartups 100",
                            "MaxSessions 100",
                            "ClientAliveInterval 5",  # a session cut off from its client ends (docs/jobs.md)
                            "ClientAliveCountMax 3",
                            "LogLevel ERROR",
                            "",
                        ]
                    )
                )
                argv = ["ip", "netns", "exec", name, SSHD, "-D", "-e", "-f", str(config)]
                host = Host(name, addr)
                cluster.hosts.append(host)
                known.append(f"{addr} {host_pub[0]} {host_pub[1]}")
            else:
                argv = ["ip", "netns", "exec", name, sys.executable, "-c", _LISTENER, addr]
                host = cluster.blackhole = Host(name, addr)
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            cluster.procs.append(proc)
            host.pid = proc.pid
            _wait_port(addr, 22, proc, log)
        Path(cluster.known_hosts).write_text("\n".join(known) + "\n")
        for path in (cluster.key, cluster.wrong_key):
            os.chmod(path, 0o600)
    except BaseException:
        cluster.close()
        raise
    return cluster


def job_processes(job_id: str, marker: str = "") -> list[tuple[int, str]]:
    """Live processes of a job anywhere on this machine (every namespace host included): those whose environment
    holds ``HORA_JOB_ID=job_id``, and those whose command line holds ``marker`` (when given) — (pid, cmdline)."""
    found = []
    needle = f"HORA_JOB_ID={job_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            if stat[stat.rindex(b")") + 2 :].split()[0] == b"Z":
                continue
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes() if job_id else b""
        except OSError:
            continue
        if (job_id and needle in environ.split(b"\0")) or (marker and marker.encode() in cmdline):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found
