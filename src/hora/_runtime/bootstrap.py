"""Finding the rendezvous store and the job secret.

Under ``hora run`` both arrive in the environment (``HORA_RENDEZVOUS_ADDR/PORT`` and ``HORA_SECRET`` or
``HORA_SECRET_FILE``). Under mpirun, srun or torchrun nobody hands them out, so rank 0 starts a store, draws a
secret and publishes both in a 0600 file inside a private 0700 directory (``HORA_RUNTIME_DIR``, default
``$TMPDIR/hora-<uid>``) named after the launcher's job id; the other ranks read it there. That needs the ranks to
share that directory: true on one host, and on clusters whose home or scratch directory is shared; otherwise set
``HORA_SECRET`` yourself and ``HORA_RENDEZVOUS_ADDR/PORT`` to where rank 0 should listen.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hora._runtime.rendezvous import RendezvousServer
from hora.config import Config
from hora.config.launchers import LaunchInfo
from hora.errors import ConfigError, RendezvousError

__all__ = [
    "Bootstrap",
    "local_addr_towards",
    "local_addresses",
    "read_secret",
    "rendezvous_host",
    "runtime_dir",
    "start_bootstrap",
]


@dataclass
class Bootstrap:
    addr: str
    port: int
    secret: bytes
    job_id: str
    server: RendezvousServer | None = None
    published: Path | None = None

    def unpublish(self) -> None:
        """Remove the bootstrap file (once every rank has connected) so no later job can read it."""
        if self.published is not None:
            try:
                self.published.unlink()
            except FileNotFoundError:
                pass
            self.published = None

    def close(self) -> None:
        self.unpublish()
        if self.server is not None:
            self.server.shutdown()
            self.server = None


def read_secret(config: Config) -> bytes | None:
    """The job secret from ``HORA_SECRET`` (hex) or ``HORA_SECRET_FILE``; ``None`` when neither is set."""
    text = config.secret
    source = "HORA_SECRET"
    if not text and config.secret_file:
        path = Path(config.secret_file)
        try:
            mode = path.stat().st_mode
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"HORA_SECRET_FILE={config.secret_file!r} cannot be read: {exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"HORA_SECRET_FILE={config.secret_file!r} is readable by others; chmod 600 it.")
        source = "HORA_SECRET_FILE"
    if not text:
        return None
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ConfigError(
            f"{source} must be hex (e.g. from 'python -c \"import secrets; print(secrets.token_hex(32))\"')"
        ) from None
    if len(secret) < 16:
        raise ConfigError(f"{source} is {len(secret)} bytes; use at least 32 random bytes")
    return secret


def runtime_dir(config: Config) -> Path:
    """The private directory for bootstrap files, created 0700 and checked to belong to this user."""
    path = Path(config.runtime_dir or os.path.join(tempfile.gettempdir(), f"hora-{os.getuid()}"))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path} must be a directory owned by you with mode 0700 (it holds job secrets)")
    return path


def local_addr_towards(host: str) -> str:
    """The local address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("localhost", "::1")


def local_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses, one per interface that has one (SIOCGIFADDR)."""
    out: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address on this interface
            addr = socket.inet_ntoa(raw[20:24])
            if not _is_loopback(addr) and addr not in out:
                out.append(addr)
    return out


def _routable_addr(why: str) -> str:
    """An address of this machine other hosts can reach: the default route's source, else the first interface's."""
    candidates = local_addresses()
    towards_default = local_addr_towards("192.0.2.1")  # TEST-NET-1: only picks the route, sends nothing
    if towards_default in candidates:
        return towards_default
    if candidates:
        return candidates[0]
    raise ConfigError(
        f"rank 0 must host the rendezvous on an address other hosts can reach ({why}), but this machine has only "
        "loopback addresses. Set HORA_BIND_ADDR to the address to listen on."
    )


def rendezvous_host(config: Config, info: LaunchInfo) -> str:
    """Where rank 0 listens when it hosts the rendezvous itself (under mpirun, srun or torchrun).

    127.0.0.1 keeps a one-host job off the network. torchrun's ``MASTER_ADDR`` names the host the others reach rank 0
    through: listen on this machine's address on the route towards it — which is the address itself when it is
    this machine's. A name that resolves to loopback here (Debian maps the host's own name to 127.0.1.1) would be
    unreachable from elsewhere, so then, unless torchrun says every rank is on this host, and whenever the launcher
    says the ranks span hosts, take a routable address.
    """
    if config.bind_addr:
        return config.bind_addr
    master = info.master_addr
    if master and not _is_loopback(master):
        try:
            socket.getaddrinfo(master, None, socket.AF_INET)
        except OSError as exc:
            raise ConfigError(
                f"MASTER_ADDR={master!r} (torchrun) cannot be resolved on this host: {exc}. Set MASTER_ADDR to an "
                "address or name every host resolves, or HORA_BIND_ADDR to the address rank 0 should listen on."
            ) from None
        addr = local_addr_towards(master)
        if not _is_loopback(addr) or (info.local_size is not None and not info.multi_host):
            return addr  # (loopback is fine when torchrun says every rank is on this host)
        return _routable_addr(f"MASTER_ADDR={master} is not a loopback address")
    if info.multi_host:
        return _routable_addr(f"{info.source} placed the ranks on several hosts")
    return "127.0.0.1"


def start_bootstrap(config: Config, info: LaunchInfo, deadline: float) -> Bootstrap:
    """Find (or, on rank 0 without a launcher store, start) the rendezvous store and the secret."""
    secret = read_secret(config)
    if config.rendezvous_addr:
        if secret is None:
            raise ConfigError(
                "HORA_RENDEZVOUS_ADDR is set but no job secret is: set HORA_SECRET or HORA_SECRET_FILE "
                "(hora run does both)."
            )
        if not config.rendezvous_port:
            raise ConfigError("HORA_RENDEZVOUS_ADDR is set but HORA_RENDEZVOUS_PORT is not.")
        return Bootstrap(
            config.rendezvous_addr, config.rendezvous_port, secret, config.job_id or info.job_key
        )
    if not info.job_key:
        raise ConfigError(
            f"this process is rank {info.rank} of {info.size} ({info.source}) but nothing tells hora where the "
            "other ranks meet: the launcher exported no job id. Start it with 'hora run', or set HORA_JOB_ID "
            "(same value on every rank) or HORA_RENDEZVOUS_ADDR/PORT and HORA_SECRET."
        )
    digest = hashlib.sha256(info.job_key.encode()).hexdigest()[:24]
    path = runtime_dir(config) / f"job-{digest}.json"
    if info.rank == 0:
        secret = secret or os.urandom(32)
        host = rendezvous_host(config, info)
        server = RendezvousServer(secret, host=host, max_frame_bytes=config.max_frame_bytes)
        addr, port = server.start()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"addr": addr, "port": port, "secret": secret.hex(), "pid": os.getpid()}, f)
        os.replace(tmp, path)
        return Bootstrap(addr, port, secret, info.job_key, server=server, published=path)
    while True:
        try:
            data = json.loads(path.read_text())
            return Bootstrap(data["addr"], int(data["port"]), bytes.fromhex(data["secret"]), info.job_key)
        except (FileNotFoundError, ValueError, KeyError):
            pass  # not written yet (or being replaced)
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"rank {info.rank} waited {config.start_timeout:g}s for rank 0 to publish the rendezvous address in "
                f"{path} and it never did: is rank 0 running, and do the ranks share {path.parent}? "
                "(raise HORA_START_TIMEOUT if rank 0 starts slowly)"
            )
        time.sleep(0.02)
