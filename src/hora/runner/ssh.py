"""SSH for ``hora run -H``: the options hora passes, the preflight check of every host, and choosing the address
the other hosts reach this machine at.

The preflight runs one ``ssh -o BatchMode=yes -o ConnectTimeout=T host ...`` per host, all at once, each under a
hard time limit of its own, and turns ssh's error into a message that names the host and says what to fix.
"""

from __future__ import annotations

import math
import shlex
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hora.errors import ConfigError, HostError
from hora.runner.agent_protocol import interface_address

__all__ = ["SshOptions", "advertise_address", "preflight", "remote_agent_command", "ssh_command"]

#: Seconds beyond ssh's own ConnectTimeout that the launcher waits for a preflight ssh before killing it.
HARD_TIMEOUT_SLACK = 5.0


@dataclass(frozen=True)
class SshOptions:
    """How ``hora run`` reaches remote hosts: ``-p``, ``-i``, extra ``-o`` options and the connect time-out."""

    port: int | None = None
    identity_file: str | None = None
    options: Sequence[str] = field(default_factory=tuple)
    connect_timeout: float = 10.0
    #: A command used instead of ``ssh [options]`` (as Open MPI's ``plm_rsh_agent``): it is given the host and the
    #: shell command, and must run the command there with its stdin/stdout/stderr connected and exit with its
    #: status. ``hora job`` reaches its hosts' agents this way (:mod:`hora.jobs._rsh`).
    agent: Sequence[str] | None = None
    #: The Python that runs the hora agent on the remote hosts (default: the launcher's own, at the same path).
    python: str | None = None

    @property
    def program(self) -> str:
        return " ".join(self.agent) if self.agent else "ssh"

    def args(self) -> list[str]:
        """Everything between ``ssh`` and the host name."""
        out = [
            "-o", "BatchMode=yes",  # never prompt for a password or passphrase: fail instead
            "-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout))}",
            "-o", "LogLevel=ERROR",  # no "Warning: Permanently added ..." lines in the job's output
            "-o", "ServerAliveInterval=5",  # notice a dead host or a broken link while the job runs
            "-o", "ServerAliveCountMax=3",
        ]  # fmt: skip
        if self.port is not None:
            out += ["-p", str(self.port)]
        if self.identity_file:
            out += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        for opt in self.options:
            out += ["-o", opt]
        return out


def ssh_command(host: str, ssh: SshOptions, remote: str) -> list[str]:
    """The argv that runs the shell command ``remote`` on ``host`` (no secret ever goes into it)."""
    if ssh.agent:
        return [*ssh.agent, host, remote]
    return ["ssh", *ssh.args(), "-T", host, remote]


@dataclass
class _Check:
    host: str
    ok: bool = False
    client_addr: str = ""  # this machine's address as the host sees it ($SSH_CONNECTION)
    problem: str = ""


def _tcp_connects(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _classify(host: str, port: int, stderr: str, code: int | None, limit: float, program: str = "ssh") -> str:
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    detail = lines[-1] if lines else f"ssh exited with {code}"
    low = stderr.lower()
    if code is None or "banner exchange" in low:
        if code is None and not _tcp_connects(host, port, min(limit, 3.0)):
            return (
                f"host {host}: cannot reach port {port} (no answer within {limit:g}s); "
                "check that the host is up and that no firewall drops SSH on the way"
            )
        return (
            f"host {host}: accepted the TCP connection on port {port} but the SSH server never answered "
            f"within {limit:g}s (a hung sshd, or a firewall or proxy that swallows the connection)"
        )
    if "connection refused" in low:
        return (
            f"host {host}: connection refused on port {port}: no SSH server listens there "
            "(start sshd, or give its port with -p/--ssh-port)"
        )
    if "permission denied" in low or "too many authentication failures" in low:
        return (
            f"host {host}: SSH authentication failed ({detail}); hora run needs password-less SSH: authorize your "
            f"public key on the host (ssh-copy-id {host}) or name the right key with -i/--ssh-identity-file"
        )
    if "host key verification failed" in low or "identification has changed" in low:
        return (
            f"host {host}: its SSH host key is unknown or has changed ({detail}); add it to known_hosts "
            f"(ssh-keyscan -p {port} {host} >> ~/.ssh/known_hosts) after checking it"
        )
    if "could not resolve" in low or "name or service not known" in low:
        return f"host {host}: the name does not resolve ({detail}); check the host name in -H or the hostfile"
    if any(s in low for s in ("timed out", "no route to host", "network is unreachable", "host is down")):
        return f"host {host}: unreachable on port {port} ({detail}); check that the host is up and routable from here"
    if "closed by" in low or "connection reset" in low:
        return (
            f"host {host}: closed the connection during the SSH handshake ({detail}); "
            f"is an SSH server listening on port {port}?"
        )
    return f"host {host}: '{program} {host} true' failed with exit code {code}: {detail}"


def _check(host: str, ssh: SshOptions, result: _Check) -> None:
    limit = ssh.connect_timeout + HARD_TIMEOUT_SLACK
    argv = ssh_command(host, ssh, 'echo "hora-preflight $SSH_CONNECTION"')
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=limit, text=True)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        result.problem = _classify(host, ssh.port or 22, stderr, None, ssh.connect_timeout, ssh.program)
        return
    except FileNotFoundError:
        result.problem = f"'{argv[0]}' is not installed on this machine" + (
            "" if ssh.agent else " (install openssh-client)"
        )
        return
    for line in proc.stdout.splitlines():
        if line.startswith("hora-preflight"):
            parts = line.split()
            result.ok = True
            result.client_addr = parts[1] if len(parts) > 1 else ""
            return
    if proc.returncode == 0:
        result.problem = (
            f"host {host}: ssh succeeded but the remote shell printed nothing; check the login shell"
        )
        return
    if ssh.agent:  # not ssh: its own message says what went wrong
        lines = [x.strip() for x in proc.stderr.splitlines() if x.strip()]
        result.problem = f"host {host}: " + (
            lines[-1] if lines else f"'{ssh.program} {host} true' exited with {proc.returncode}"
        )
        return
    result.problem = _classify(host, ssh.port or 22, proc.stderr, proc.returncode, ssh.connect_timeout)


def preflight(hosts: Sequence[str], ssh: SshOptions) -> dict[str, str]:
    """Check every host over SSH in parallel; return each host's view of this machine's address.

    Raises:
        HostError: one or more hosts cannot be used; the message lists each with the reason and the fix.
    """
    results = {h: _Check(h) for h in hosts}
    threads = [threading.Thread(target=_check, args=(h, ssh, results[h]), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in results.values() if not r.ok]
    if bad:
        check = "host check" if ssh.agent else "SSH check"
        head = f"cannot start the job: {len(bad)} of {len(hosts)} remote host(s) failed the {check}"
        raise HostError(head + ":\n  " + "\n  ".join(r.problem for r in bad))
    return {h: r.client_addr for h, r in results.items()}


def _resolve(host: str) -> str | None:
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        return None


def advertise_address(remote_hosts: Sequence[str], interface: str | None, seen: dict[str, str],
                      addresses: Mapping[str, str] | None = None) -> str:
    """The address of this machine that the remote hosts can reach (its rendezvous store binds it).

    ``--network-interface`` decides when given; otherwise the kernel's route towards the first remote host (a UDP
    connect, which sends nothing; ``addresses`` gives the address of a host whose name does not resolve), and
    failing that the address the host saw the preflight SSH connection come from.
    """
    if interface:
        try:
            return interface_address(interface)
        except OSError as exc:
            raise ConfigError(f"--network-interface: {exc}") from None
    for host in remote_hosts:
        addr = (addresses or {}).get(host) or _resolve(host)
        if addr is None:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((addr, 9))
                return str(s.getsockname()[0])
        except OSError:
            continue
    for host in remote_hosts:
        if seen.get(host):
            return seen[host]
    raise ConfigError(
        f"cannot tell which address of this machine {remote_hosts[0]} can reach; name the interface with "
        "--network-interface"
    )


def remote_agent_command(python: str, pythonpath: str | None) -> str:
    """The shell command that starts the agent on a remote host (its job, secret included, follows on stdin)."""
    env = f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else ""
    return f"{env}exec {shlex.quote(python)} -u -m hora.runner.host_agent"
