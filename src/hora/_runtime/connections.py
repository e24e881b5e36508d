"""Authenticated peer connections made at start-up: each rank listens once; peers dial in with a declared role."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from typing import Any

from hora._runtime.auth import Role, server_handshake
from hora._runtime.rendezvous import connect_with_retry
from hora.errors import AuthenticationError, ConfigError, HoraError, ProtocolError, RendezvousError

__all__ = ["PeerListener", "close_all", "connect_peers"]

log = logging.getLogger(__name__)


def _bind(addr: str, port_range: str) -> socket.socket:
    """A listening socket on ``addr``: any free port, or the first free one of ``port_range`` (``LOW-HIGH``, tried
    from a random start so the ranks of one host do not all race for the same port)."""
    if not port_range:
        return socket.create_server((addr, 0), backlog=128)
    low, high = (int(x) for x in port_range.split("-"))
    ports = list(range(low, high + 1))
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        try:
            return socket.create_server((addr, port), backlog=128)
        except OSError:
            continue
    raise ConfigError(
        f"no free port on {addr} in HORA_PORT_RANGE={port_range}: every rank of a host needs one (two with "
        "process sets); widen the range"
    )


class PeerListener:
    """A listening socket that accepts only expected (role, rank) peers that pass the handshake.

    Connections that fail authentication, send garbage or are not expected are dropped and counted; the listener
    keeps waiting for the real peers until the deadline.
    """

    def __init__(self, bind_addr: str, secret: bytes, port_range: str = "") -> None:
        self._secret = secret
        self.sock = _bind(bind_addr, port_range)
        self.rejected = 0
        self._result: dict[tuple[Role, int], socket.socket] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def start_accepting(self, expected: set[tuple[Role, int]], deadline: float) -> None:
        self._thread = threading.Thread(
            target=self._accept, args=(expected, deadline), name="hora-accept", daemon=True
        )
        self._thread.start()

    def wait(self) -> dict[tuple[Role, int], socket.socket]:
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            for s in self._result.values():
                s.close()
            raise self._error
        return self._result

    def _accept(self, expected: set[tuple[Role, int]], deadline: float) -> None:
        try:
            while len(self._result) < len(expected):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(expected - set(self._result), key=lambda x: (x[0], x[1]))
                    raise RendezvousError(
                        "timed out waiting for peers to connect: "
                        + ", ".join(f"rank {r} ({role.name.lower()})" for role, r in missing)
                    )
                self.sock.settimeout(left)
                try:
                    conn, addr = self.sock.accept()
                except TimeoutError:
                    continue
                try:
                    role, rank = server_handshake(conn, self._secret, timeout=min(left, 5.0))
                except (AuthenticationError, ProtocolError, OSError) as exc:
                    self.rejected += 1
                    log.warning("dropped a connection from %s: %s", addr, exc)
                    conn.close()
                    continue
                key = (role, rank)
                if key not in expected or key in self._result:
                    self.rejected += 1
                    log.warning("dropped an unexpected %s connection claiming rank %d", role.name, rank)
                    conn.close()
                    continue
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._result[key] = conn
        except BaseException as exc:
            self._error = exc

    def close(self) -> None:
        self.sock.close()


def connect_peers(
    targets: list[tuple[int, str, int]], role: Role, my_rank: int, secret: bytes, deadline: float
) -> dict[int, socket.socket]:
    """Dial every (rank, host, port) in ``targets`` as ``my_rank`` for ``role``."""
    out: dict[int, socket.socket] = {}
    try:
        for rank, host, port in targets:
            out[rank] = connect_with_retry(host, port, secret, role, my_rank, deadline, f"rank {rank}")
    except HoraError:
        for s in out.values():
            s.close()
        raise
    return out


def close_all(objs: list[Any]) -> None:
    """Close what a failed start opened, newest first; a close that fails must not hide the start's own error."""
    for obj in reversed(objs):
        try:
            obj.close()
        except Exception:
            pass
