"""The parameter server: a process that owns shards of variables and applies the workers' gradients to them.

Every connection is authenticated with the job secret (role ``PS``) before a byte of it is parsed, each in a
thread of its own with its own deadline (:mod:`hora._runtime.gate`), so silent or garbage clients cost the workers
nothing and the server keeps serving. Then each worker's requests are served in order on its connection
(:mod:`hora.ps.protocol`): ``register``, ``layout``, ``push``, ``pull``, ``push_pull``, ``push_rows``,
``pull_rows``, ``stats``, ``save``, ``load``.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import numpy as np

from hora._runtime.auth import Role, server_handshake
from hora._runtime.gate import PendingHandshakes, RejectLog
from hora._wire import recv_exact
from hora.errors import (
    AuthenticationError,
    HoraError,
    MismatchError,
    PeerLostError,
    ProtocolError,
    TimeoutError,
)
from hora.ps import checkpoint
from hora.ps.protocol import recv_header, recv_payload, recv_payload_into, send_message
from hora.ps.rules import check_rule
from hora.ps.shard import Shard

__all__ = ["DTYPES", "ParameterServer"]

log = logging.getLogger(__name__)

#: dtypes a variable may have (the update rules compute in the variable's own type).
DTYPES = ("<f4", "<f8")
_MODES = ("async", "bounded", "sync")


class ParameterServer:
    """Server ``index`` of a job whose ``workers`` workers connect with ``secret``. ``start()`` binds and serves;
    ``shutdown(timeout)`` stops it and closes every connection."""

    def __init__(
        self, secret: bytes, index: int, workers: int, host: str = "127.0.0.1", port: int = 0,
        op_timeout: float = 300.0, handshake_timeout: float = 10.0, max_bytes: int = 16 << 30,
    ) -> None:  # fmt: skip
        self.index = index
        self.workers = workers
        self._secret = secret
        self._op_timeout = op_timeout
        self._handshake_timeout = handshake_timeout
        self._max_bytes = max_bytes  # largest payload a request may announce
        self._listener = socket.create_server((host, port), backlog=128)
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._shards: dict[tuple[str, int], Shard] = {}
        self._layouts: dict[str, dict[str, Any]] = {}
        self._clients: set[socket.socket] = set()
        self._closed = threading.Event()
        self._pending = PendingHandshakes()
        self._rejects = RejectLog(log, f"parameter server {index}")
        self._thread: threading.Thread | None = None
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def rejected(self) -> int:
        return self._rejects.count

    def start(self) -> tuple[str, int]:
        self._thread = threading.Thread(target=self._accept_loop, name=f"hora-ps-{self.index}", daemon=True)
        self._thread.start()
        return self.address

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`shutdown`; True when it happened."""
        return self._closed.wait(timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._pending.close()
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            _close(c)
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            shards = list(self._shards.values())
        return {
            "server": self.index,
            "shards": len(shards),
            "bytes_stored": sum(s.value.nbytes for s in shards),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "max_staleness": max((s.max_staleness for s in shards), default=0),
            "rejected_connections": self.rejected,
        }

    # -- connections ----------------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                self._closed.wait(0.05)  # out of descriptors and the like: the clients retry
                continue
            if self._pending.admit(conn):
                threading.Thread(target=self._serve, args=(conn,), name="hora-ps-client", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rank = -1
        try:
            try:
                _, rank = server_handshake(conn, self._secret, self._handshake_timeout, roles=(Role.PS,))
            finally:
                self._pending.finish(conn)
            if not 0 <= rank < self.workers:
                raise AuthenticationError(f"a client claimed worker {rank}; this job has workers 0..{self.workers - 1}")
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed.is_set():
                    return
                self._clients.add(conn)
                shards = list(self._shards.values())
            for s in shards:
                s.rejoin(rank)
            what = f"worker {rank}"
            while True:
                try:
                    header = recv_header(conn, what)
                except PeerLostError:
                    return
                self._request(conn, rank, header, what)
        except (AuthenticationError, ProtocolError) as exc:
            self._rejects.drop(exc)
        except OSError:
            pass
        finally:
            with self._lock:
                self._clients.discard(conn)
                shards = list(self._shards.values())
            if rank >= 0:
                for s in shards:
                    s.leave(rank)
            _close(conn)

    def _request(self, conn: socket.socket, rank: int, header: dict[str, Any], what: str) -> None:
        op = header.get("op")
        nbytes = header["nbytes"]
        if nbytes > self._max_bytes:
            raise ProtocolError(f"{what} announced a payload of {nbytes} bytes, above this server's limit")
        try:
            reply, payload = self._dispatch(conn, rank, op, header, what)
        except (HoraError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            if header.get("_read") is False and nbytes:
                _drain(conn, nbytes, what)
            send_message(conn, {"ok": False, "type": type(exc).__name__, "error": str(exc)})
            return
        self.bytes_out += sum(memoryview(p).nbytes for p in payload)
        send_message(conn, reply, payload)

    def _shard(self, header: dict[str, Any]) -> Shard:
        key = (str(header["name"]), int(header["shard"]))
        with self._lock:
            shard = self._shards.get(key)
        if shard is None:
            raise KeyError(f"server {self.index} holds no shard {key[1]} of '{key[0]}': register the variable first")
        return shard

    def _dispatch(
        self, conn: socket.socket, rank: int, op: Any, header: dict[str, Any], what: str
    ) -> tuple[dict[str, Any], list[Any]]:
        header["_read"] = False  # the payload is still on the wire until a handler reads it
        nbytes = header["nbytes"]
        if op == "register":
            return self._register(conn, rank, header, what), []
        if op == "layout":
            return self._layout(rank, header), []
        if op == "poison":
            return self._poison(header), []
        if op == "stats":
            return {"ok": True, "stats": self.stats()}, []
        if op in ("save", "load"):
            return self._checkpoint(op, header), []
        shard = self._shard(header)
        if shard.poisoned:
            raise MismatchError(shard.poisoned)
        if op in ("push", "push_pull"):
            if nbytes != shard.value.nbytes:
                raise ProtocolError(f"{what} pushed {nbytes} bytes to '{shard.name}' shard {shard.index} of {shard.value.nbytes}")
            grad = np.empty_like(shard.value)
            header["_read"] = True
            recv_payload_into(conn, grad, what)
            self.bytes_in += nbytes
            shard.push(rank, grad)
            if op == "push":
                return {"ok": True}, []
        if op in ("pull", "push_pull"):
            if op == "pull" and nbytes:
                raise ProtocolError(f"{what} sent a payload with a pull")
            return {"ok": True}, [shard.read(rank, self._op_timeout)]
        if op in ("push_rows", "pull_rows"):
            n = int(header["n"])
            row = shard.row_bytes
            due = n * 8 + (n * row if op == "push_rows" else 0)
            if n < 0 or nbytes != due:
                raise ProtocolError(f"{what} sent {nbytes} bytes for {n} rows of '{shard.name}' (due: {due})")
            header["_read"] = True
            data = recv_payload(conn, nbytes, what)
            self.bytes_in += nbytes
            rows = data[: n * 8].view("<i8")
            if n and (rows.min() < 0 or rows.max() >= len(shard.value)):
                raise ValueError(f"{op} '{shard.name}' shard {shard.index}: row ids out of range 0..{len(shard.value) - 1}")
            if op == "pull_rows":
                return {"ok": True}, [shard.read_rows(rank, rows, self._op_timeout)]
            if len(np.unique(rows)) != n:
                raise ValueError(f"push_rows '{shard.name}': row ids must be unique (the client sums duplicates)")
            grads = data[n * 8 :].view(shard.value.dtype).reshape((n, *shard.value.shape[1:]))
            shard.push(rank, (rows.astype(np.intp), grads))
            return {"ok": True}, []
        raise ProtocolError(f"{what} asked for unknown operation {op!r}")

    def _register(self, conn: socket.socket, rank: int, header: dict[str, Any], what: str) -> dict[str, Any]:
        name, index = str(header["name"]), int(header["shard"])
        dtype = str(header["dtype"])
        if dtype not in DTYPES:
            raise ValueError(f"register '{name}': dtype {dtype!r} is not supported; use float32 ('<f4') or float64 ('<f8')")
        shape = tuple(int(d) for d in header["shape"])
        if not shape or min(shape) < 0:
            raise ValueError(f"register '{name}': shape {shape} must have at least one axis")
        rule = check_rule(header["rule"], f"register '{name}'")
        mode, staleness = str(header["consistency"]), int(header["staleness"])
        if mode not in _MODES or staleness < 0:
            raise ValueError(f"register '{name}': consistency {mode!r}/{staleness} is not async, bounded(k>=0) or sync")
        due = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if header["nbytes"] != due:  # checked before allocating anything of the announced shape
            raise ProtocolError(f"{what} sent {header['nbytes']} bytes for '{name}' shard {index} of {due}")
        value = np.empty(shape, dtype)
        header["_read"] = True
        recv_payload_into(conn, value, what)
        self.bytes_in += value.nbytes
        shard = Shard(name, index, value, rule, mode, staleness, self.workers)
        with self._registered:
            if rank == 0:  # worker 0's values win, as when Horovod broadcasts the parameters from rank 0
                existing = self._shards.setdefault((name, index), shard)
                self._registered.notify_all()
            elif not self._registered.wait_for(lambda: (name, index) in self._shards, self._op_timeout):
                raise TimeoutError(
                    f"register '{name}' shard {index}: worker {rank} waited {self._op_timeout:g}s for worker 0 to "
                    "register it; every worker must register the same variables"
                )
            else:
                existing = self._shards[(name, index)]
        if existing is not shard:
            existing.check_same(shard.describe(), rank)
        return {"ok": True}

    def _layout(self, rank: int, header: dict[str, Any]) -> dict[str, Any]:
        """Server 0 keeps every variable's layout (shape, dtype, rule, consistency, shards and their servers): a
        worker whose layout differs gets the first one's servers back, to stop them serving the variable."""
        name, layout = str(header["name"]), header["layout"]
        with self._lock:
            first = self._layouts.setdefault(name, layout)
        if first == layout:
            return {"ok": True}
        diff = [f"{k} {layout.get(k)!r} (worker 0: {first.get(k)!r})" for k in first if first.get(k) != layout.get(k)]
        message = (
            f"register '{name}': worker {rank} registered it with {'; '.join(diff)}; every worker must register the "
            "same variables (shape, dtype, rule, consistency) in the same order with the same partitioner"
        )
        return {"ok": True, "mismatch": message, "name": name, "servers": sorted(set(first["servers"]))}

    def _poison(self, header: dict[str, Any]) -> dict[str, Any]:
        """A registration mismatch found elsewhere: every later request on this variable's shards raises it."""
        with self._lock:
            shards = [s for (n, _), s in self._shards.items() if n == str(header["name"])]
        for s in shards:
            s.poisoned = str(header["message"])
        return {"ok": True}

    def _checkpoint(self, op: str, header: dict[str, Any]) -> dict[str, Any]:
        directory = str(header["dir"])
        with self._lock:
            shards = dict(self._shards)
        if op == "save":
            files = checkpoint.save_shards(directory, self.index, shards)
            return {"ok": True, "files": files}
        checkpoint.load_shards(directory, shards, header["sources"])
        return {"ok": True}


def _drain(conn: socket.socket, n: int, what: str) -> None:
    """Read and drop a payload frame of ``n`` bytes (after a request failed before its payload was read)."""
    if int.from_bytes(recv_exact(conn, 8, what), "big") != n:
        raise ProtocolError(f"{what} sent a payload frame whose length differs from its header's")
    while n:
        n -= len(recv_exact(conn, min(n, 1 << 20), what))


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
