"""The rendezvous store: a tiny authenticated key-value server through which ranks find each other.

``hora run`` hosts it in the launcher; under mpirun, srun or torchrun rank 0 hosts it. Clients authenticate
before any request is parsed (see :mod:`hora._runtime.auth`). Keys are namespaced by the client (job id, attempt
and init generation), so a restarted group never reads stale addresses. Values are short strings (JSON text).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from typing import Any

from hora._runtime.auth import Role, client_handshake, server_handshake
from hora._runtime.gate import PendingHandshakes, RejectLog
from hora._wire import close_socket, recv_frame, send_frame
from hora.errors import AuthenticationError, HoraError, PeerLostError, ProtocolError, RendezvousError

__all__ = ["MissingKeys", "RendezvousClient", "RendezvousServer", "connect_with_retry"]

log = logging.getLogger(__name__)

_MAX_WAIT = 3600.0
#: accept() errors that pass: the process or the system is short of descriptors or memory, or a client left early.
_RETRY_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO,
                 errno.EPERM, errno.EINTR}


class RendezvousServer:
    """Threaded key-value server. ``start()`` binds and serves; ``shutdown()`` stops it and closes every client."""

    def __init__(
        self,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = 1 << 20,
        handshake_timeout: float = 10.0,
    ) -> None:
        self._secret = secret
        self._host = host
        self._port = port
        self._max_frame = max_frame_bytes
        self._handshake_timeout = handshake_timeout
        self._data: dict[str, str] = {}
        self._cond = threading.Condition()
        self._listener: socket.socket | None = None
        self._clients: set[socket.socket] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._rejects = RejectLog(log, "rendezvous")
        self._accept_errors = RejectLog(log, "rendezvous")
        self._pending = PendingHandshakes()

    @property
    def rejected(self) -> int:
        """Connections dropped for failed authentication or protocol errors (for tests and logs)."""
        return self._rejects.count

    @property
    def address(self) -> tuple[str, int]:
        if self._listener is None:
            raise HoraError("the rendezvous server is not started")
        host, port = self._listener.getsockname()[:2]
        return host, port

    def bind(self) -> tuple[str, int]:
        """Bind and listen without serving yet (so a launcher can fork workers before starting threads)."""
        self._listener = socket.create_server((self._host, self._port), backlog=128)
        return self.address

    def start(self) -> tuple[str, int]:
        if self._listener is None:
            self.bind()
        self._thread = threading.Thread(target=self._accept_loop, name="hora-rendezvous", daemon=True)
        self._thread.start()
        return self.address

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            clients = list(self._clients)
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        self._pending.close()
        for c in clients:
            close_socket(c)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- in-process access (the launcher watches registrations without a socket) --------------------------
    def snapshot(self, prefix: str = "") -> dict[str, str]:
        with self._cond:
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

    def put(self, items: dict[str, str]) -> None:
        """Set several keys at once, as one change every waiting client sees together (the elastic launcher)."""
        with self._cond:
            self._data.update(items)
            self._cond.notify_all()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        delay = 0.01
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError as exc:
                if self._closed or exc.errno not in _RETRY_ACCEPT:
                    return
                # Out of file descriptors or memory: the clients wait in the backlog (and retry), so back off
                # and keep serving rather than stop for good; say why, so a client timing out can be explained.
                # Out of descriptors with idle unauthenticated clients held, the oldest gives way at once.
                room = self._pending.make_room(exc)
                self._accept_errors.drop(
                    f"cannot accept connections: {exc.strerror} (errno {exc.errno}); "
                    + ("cut the oldest unauthenticated connection to make room" if room else "retrying")
                    + " — raise the open-file limit (ulimit -n) if this persists"
                )
                time.sleep(0.005 if room else delay)
                delay = 0.01 if room else min(delay * 2, 0.5)
                continue
            delay = 0.01
            if not self._pending.admit(conn):
                close_socket(conn)
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="hora-rendezvous-client", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._cond:
            if self._closed:
                close_socket(conn)
                return
            self._clients.add(conn)
        try:
            try:
                server_handshake(conn, self._secret, self._handshake_timeout, roles=(Role.RENDEZVOUS,))
            finally:
                self._pending.finish(conn)
            while True:
                try:
                    frame = recv_frame(conn, self._max_frame, "rendezvous client")
                except PeerLostError:
                    return  # the client went away
                try:
                    request = json.loads(frame)
                    if not isinstance(request, dict):
                        raise ValueError("not an object")
                    reply = self._handle(request)
                except (ValueError, KeyError, TypeError) as exc:
                    raise ProtocolError(f"malformed rendezvous request: {exc}") from exc
                send_frame(conn, json.dumps(reply).encode())
        except (AuthenticationError, ProtocolError) as exc:
            self._rejects.drop(exc)
        except OSError:
            pass
        finally:
            with self._cond:
                self._clients.discard(conn)
            close_socket(conn)

    def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        with self._cond:
            if op == "set":
                self._data[str(req["key"])] = str(req["value"])
                self._cond.notify_all()
                return {"ok": True}
            if op == "get":
                return {"ok": True, "value": self._data.get(str(req["key"]))}
            if op == "add":
                key = str(req["key"])
                value = int(self._data.get(key, "0")) + int(req["amount"])
                self._data[key] = str(value)
                self._cond.notify_all()
                return {"ok": True, "value": value}
            if op == "wait":
                keys = [str(k) for k in req["keys"]]
                minimum = req.get("at_least")
                deadline = time.monotonic() + min(float(req["timeout"]), _MAX_WAIT)

                def ready() -> bool:
                    if minimum is not None:
                        return all(int(self._data.get(k, "0")) >= int(minimum) for k in keys)
                    return all(k in self._data for k in keys)

                while not ready() and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if ready():
                    return {"ok": True, "values": {k: self._data[k] for k in keys}}
                missing = [
                    k
                    for k in keys
                    if k not in self._data or (minimum is not None and int(self._data[k]) < int(minimum))
                ]
                return {"ok": False, "missing": missing, "closed": self._closed}
        raise ValueError(f"unknown op {op!r}")



def connect_with_retry(
    addr: str, port: int, secret: bytes, role: Role, rank: int, deadline: float, what: str
) -> socket.socket:
    """Connect and authenticate, retrying refused connections until ``deadline`` (a ``time.monotonic()`` value)."""
    delay = 0.01
    last: Exception | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousError(f"could not reach {what} at {addr}:{port}: {last or 'timed out'}")
        try:
            sock = socket.create_connection((addr, port), timeout=min(left, 10.0))
        except (TimeoutError, ConnectionRefusedError, OSError) as exc:
            last = exc
            time.sleep(min(delay, max(left, 0)))
            delay = min(delay * 2, 0.5)
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_handshake(sock, secret, role, rank, timeout=min(max(left, 1.0), 10.0))
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock


class RendezvousClient:
    """A connection to the rendezvous store whose keys all live under ``prefix``."""

    def __init__(
        self,
        addr: str,
        port: int,
        secret: bytes,
        rank: int,
        prefix: str,
        deadline: float,
        max_frame_bytes: int = 1 << 20,
    ) -> None:
        self.addr, self.port, self.prefix, self.rank = addr, port, prefix, rank
        self._max_frame = max_frame_bytes
        self._lock = threading.Lock()
        self._sock = connect_with_retry(
            addr, port, secret, Role.RENDEZVOUS, rank, deadline, "the rendezvous store"
        )

    def _call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            self._sock.settimeout(timeout + 10.0)
            try:
                send_frame(self._sock, json.dumps(request).encode())
                reply = json.loads(recv_frame(self._sock, self._max_frame, "the rendezvous store"))
            except (OSError, HoraError) as exc:
                raise RendezvousError(f"lost the rendezvous store at {self.addr}:{self.port}: {exc}") from exc
        return reply

    def set(self, key: str, value: str) -> None:
        self._call({"op": "set", "key": self.prefix + key, "value": value}, 10.0)

    def get(self, key: str) -> str | None:
        return self._call({"op": "get", "key": self.prefix + key}, 10.0)["value"]

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._call({"op": "add", "key": self.prefix + key, "amount": amount}, 10.0)["value"])

    def wait(self, keys: list[str], timeout: float, at_least: int | None = None) -> dict[str, str]:
        """Wait until every key exists (or, with ``at_least``, holds a counter ≥ it); raise naming the missing keys."""
        full = [self.prefix + k for k in keys]
        request: dict[str, Any] = {"op": "wait", "keys": full, "timeout": timeout}
        if at_least is not None:
            request["at_least"] = at_least
        reply = self._call(request, timeout)
        if not reply["ok"]:
            missing = [k[len(self.prefix) :] for k in reply["missing"]]
            raise MissingKeys(missing)
        return {k[len(self.prefix) :]: v for k, v in reply["values"].items()}

    def close(self) -> None:
        close_socket(self._sock)


class MissingKeys(RendezvousError):
    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"timed out waiting for {missing}")
        self.missing = missing
