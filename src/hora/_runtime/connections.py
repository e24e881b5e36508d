"""Authenticated peer connections made at start-up: each rank listens once; peers dial in with a declared role."""

from __future__ import annotations

import logging
import random
import select
import socket
import threading
import time
from typing import Any

from hora._runtime.auth import Role, server_handshake
from hora._runtime.gate import PendingHandshakes, RejectLog
from hora._runtime.rendezvous import connect_with_retry
from hora.errors import AuthenticationError, ConfigError, HoraError, ProtocolError, RendezvousError

__all__ = ["PeerListener", "bind_listener", "close_all", "connect_peers"]

log = logging.getLogger(__name__)

#: Seconds one client may take for its handshake.
HANDSHAKE_SECONDS = 5.0


def bind_listener(addr: str, port_range: str) -> socket.socket:
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

    Each connection's handshake runs in a thread of its own with its own deadline (:mod:`hora._runtime.gate`), so
    connections that say nothing, fail authentication, send garbage or are not expected are dropped and counted
    without delaying the real peers; the listener keeps waiting for them until the deadline.
    """

    def __init__(self, bind_addr: str, secret: bytes, port_range: str = "") -> None:
        self._secret = secret
        self.sock = bind_listener(bind_addr, port_range)
        self._rejects = RejectLog(log, "peer listener")
        self._pending = PendingHandshakes()
        self._lock = threading.Lock()
        self._complete = threading.Event()
        self._expected: set[tuple[Role, int]] = set()
        self._result: dict[tuple[Role, int], socket.socket] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def rejected(self) -> int:
        return self._rejects.count

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def start_accepting(self, expected: set[tuple[Role, int]], deadline: float) -> None:
        self._expected = set(expected)
        if not self._expected:
            self._complete.set()
        self._thread = threading.Thread(target=self._accept, args=(deadline,), name="hora-accept", daemon=True)
        self._thread.start()

    def wait(self) -> dict[tuple[Role, int], socket.socket]:
        assert self._thread is not None
        self._thread.join()
        self._pending.close()  # the silent ones that are still around
        with self._lock:
            result, self._result = self._result, {}
            self._complete.set()  # handshakes finishing from now on close their connection
        if self._error is not None:
            for s in result.values():
                s.close()
            raise self._error
        return result

    def _accept(self, deadline: float) -> None:
        try:
            while not self._complete.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    with self._lock:
                        missing = sorted(self._expected - set(self._result), key=lambda x: (x[0], x[1]))
                    raise RendezvousError(
                        "timed out waiting for peers to connect: "
                        + ", ".join(f"rank {r} ({role.name.lower()})" for role, r in missing)
                    )
                readable, _, _ = select.select([self.sock], [], [], min(left, 0.1))
                if not readable:
                    continue
                try:
                    conn, addr = self.sock.accept()
                except OSError as exc:  # EMFILE and the like: the peers retry; keep serving
                    room = self._pending.make_room(exc)  # out of descriptors: an idle unauthenticated one gives way
                    cut = "; cut the oldest unauthenticated one" if room else ""
                    self._rejects.drop(f"accept failed: {exc}{cut}")
                    time.sleep(0.005 if room else 0.05)
                    continue
                if self._pending.admit(conn):
                    threading.Thread(
                        target=self._handshake,
                        args=(conn, addr, min(left, HANDSHAKE_SECONDS)),
                        name="hora-handshake",
                        daemon=True,
                    ).start()
                else:
                    conn.close()
        except BaseException as exc:
            self._error = exc

    def _handshake(self, conn: socket.socket, addr: Any, timeout: float) -> None:
        try:
            role, rank = server_handshake(conn, self._secret, timeout=timeout)
        except (AuthenticationError, ProtocolError, OSError) as exc:
            self._rejects.drop(f"from {addr}: {exc}")
            conn.close()
            return
        finally:
            self._pending.finish(conn)
        key = (role, rank)
        with self._lock:
            taken = self._complete.is_set() or key not in self._expected or key in self._result
            if not taken:
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._result[key] = conn
                if len(self._result) == len(self._expected):
                    self._complete.set()
        if taken:
            self._rejects.drop(f"an unexpected {role.name} connection claiming rank {rank}")
            conn.close()

    def close(self) -> None:
        self._complete.set()
        self._pending.close()
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
