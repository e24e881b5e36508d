"""The parameter server: a process that owns shards of variables and applies the workers' gradients to them.

Every connection is authenticated with the job secret (role ``PS``) before a byte of it is parsed, each in a
thread of its own with its own deadline (:mod:`hora._runtime.gate`), so silent or garbage clients cost the workers
nothing and the server keeps serving. Then each worker's requests are served in order on its connection by a
:class:`~hora.ps.worker_link.WorkerLink`: the hot ones (``push``, ``pull``, ``push_pull``, ``push_rows``,
``pull_rows``) by the link itself, the control ones (:mod:`hora.ps.messages`: ``register``, ``layout``,
``poison``, ``shm``, ``stats``, ``save``, ``load``) by :meth:`ParameterServer.handle`.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Any

from hora._runtime.auth import Role, server_handshake
from hora._runtime.gate import PendingHandshakes, RejectLog
from hora._wire import close_socket
from hora.errors import (
    AuthenticationError,
    ProtocolError,
    TimeoutError,
)
from hora.ps import checkpoint
from hora.ps.messages import (
    AttachSegment,
    ControlRequest,
    Layout,
    LayoutReply,
    Load,
    Poison,
    Register,
    Reply,
    Save,
    SaveReply,
    Stats,
    StatsReply,
    VariableLayout,
)
from hora.ps.shard import Shard
from hora.ps.worker_link import WorkerLink

if TYPE_CHECKING:
    from hora.ps.autosave import ShardSaver

__all__ = ["ParameterServer"]

log = logging.getLogger(__name__)


class ParameterServer:
    """Server ``index`` of a job whose ``workers`` workers connect with ``secret``. ``start()`` binds and serves;
    ``shutdown(timeout)`` stops it and closes every connection."""

    def __init__(
        self,
        secret: bytes,
        index: int,
        workers: int,
        host: str = "127.0.0.1",
        port: int = 0,
        op_timeout: float = 300.0,
        handshake_timeout: float = 10.0,
        max_bytes: int = 16 << 30,
    ) -> None:
        self.index = index
        self.workers = workers
        self._secret = secret
        self.op_timeout = op_timeout
        self._handshake_timeout = handshake_timeout
        self.max_bytes = max_bytes  # largest payload a request may announce
        self._listener = socket.create_server((host, port), backlog=128)
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._shards: dict[tuple[str, int], Shard] = {}
        # server 0: every variable's layout, as the first worker gave it
        self._layouts: dict[str, VariableLayout] = {}
        self._clients: set[socket.socket] = set()
        self._live: dict[int, int] = {}  # connections open per worker
        self._closed = threading.Event()
        self._pending = PendingHandshakes()
        self._rejects = RejectLog(log, f"parameter server {index}")
        self._thread: threading.Thread | None = None
        self.bytes_in = 0
        self.bytes_out = 0
        # checkpoints for restarts (hora.ps.autosave), set before start()
        self.saver: ShardSaver | None = None
        self.restored_from = ""  # a restart: the checkpoint directory its shards came from

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
            close_socket(c)
        if self._thread is not None:
            self._thread.join(timeout)
        if self.saver is not None:
            self.saver.close(timeout)

    def adopt(self, shards: dict[tuple[str, int], Shard], layouts: dict[str, VariableLayout]) -> None:
        """Serve these shards (restored from a checkpoint) as if the workers had registered them."""
        with self._lock:
            self._shards.update(shards)
            self._layouts.update(layouts)

    def stats(self, progress: bool = False) -> dict[str, Any]:
        """Counters; with ``progress`` also each variable's per-worker push counts and the pulls waiting now."""
        with self._lock:
            shards = list(self._shards.values())
        out = {
            "server": self.index,
            "shards": len(shards),
            "bytes_stored": sum(s.value.nbytes for s in shards),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "max_staleness": max((s.max_staleness for s in shards), default=0),
            "staleness": _per_variable(shards),
            "rejected_connections": self.rejected,
        }
        if progress:  # O(variables x workers): only when asked, the reply header is at most 1 MiB
            out.update(clocks=_clocks(shards), waiting=_waiting(shards))
        return out

    # -- connections ----------------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError as exc:
                if self._closed.is_set():
                    return
                # out of descriptors and the like: an idle unauthenticated client gives way, or the clients retry
                self._closed.wait(0.005 if self._pending.make_room(exc) else 0.05)
                continue
            if self._pending.admit(conn):
                threading.Thread(target=self._serve, args=(conn,), name="hora-ps-client", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        link: WorkerLink | None = None
        try:
            try:
                _, rank = server_handshake(sock, self._secret, self._handshake_timeout, roles=(Role.PS,))
            finally:
                self._pending.finish(sock)
            if not 0 <= rank < self.workers:
                raise AuthenticationError(
                    f"a client claimed worker {rank}; this job has workers 0..{self.workers - 1}"
                )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed.is_set():
                    return
                self._clients.add(sock)
                self._live[rank] = self._live.get(rank, 0) + 1
                shards = list(self._shards.values())
            link = WorkerLink(self, sock, rank)
            for s in shards:
                s.rejoin(rank)
            link.serve()
        except (AuthenticationError, ProtocolError) as exc:
            self._rejects.drop(exc)
        except OSError:
            pass
        except ValueError:  # select() on a socket that shutdown() closed meanwhile: nothing to report
            if not self._closed.is_set():
                raise
        finally:
            gone = False
            with self._lock:
                self._clients.discard(sock)
                shards = list(self._shards.values())
                if link is not None:
                    self._live[link.rank] -= 1
                    # an old connection noticed closed late must not mark a worker gone that is connected again
                    gone = not self._live[link.rank]
            if link is not None:
                for s in shards if gone else ():
                    s.leave(link.rank)
                link.close()
            close_socket(sock)

    def shard(self, name: str, index: int) -> Shard:
        shard = self._shards.get((name, index))  # one dict read: atomic, no lock needed
        if shard is None:
            if self.restored_from:  # registered with the server before its restart, but never saved
                raise KeyError(
                    f"server {self.index} holds no shard {index} of '{name}': it was restarted and its checkpoint "
                    f"{self.restored_from} has none (the server died before saving it); the variable's values are "
                    f"lost, start the job again"
                )
            raise KeyError(
                f"server {self.index} holds no shard {index} of '{name}': register the variable first"
            )
        return shard

    def handle(self, link: WorkerLink, request: ControlRequest) -> Reply:
        """A worker's control request, done: the reply."""
        match request:
            case Register():
                return self._register(link, request)
            case Layout():
                return self._layout(link.rank, request)
            case Poison():
                return self._poison(request)
            case AttachSegment():
                return link.attach(request)
            case Stats():
                return StatsReply(self.stats(request.progress))
            case Save():
                return SaveReply(tuple(checkpoint.save_shards(request.dir, self.index, self._shards_now())))
            case Load():
                checkpoint.load_shards(request.dir, self._shards_now(), request.sources)
                return Reply()
        raise ProtocolError(f"{link.what} asked for {request!r}, which this server does not serve")

    def _shards_now(self) -> dict[tuple[str, int], Shard]:
        with self._lock:
            return dict(self._shards)

    def _register(self, link: WorkerLink, request: Register) -> Reply:
        rank, name, index = link.rank, request.name, request.shard
        value = link.read_payload(request.nbytes, name).view(request.dtype).reshape(request.shape).copy()
        shard = Shard(name, index, value, request.rule, request.consistency, request.staleness, self.workers)
        with self._registered:
            if rank == 0:  # worker 0's values win, as when Horovod broadcasts the parameters from rank 0
                existing = self._shards.setdefault((name, index), shard)
                self._registered.notify_all()
            elif not self._registered.wait_for(lambda: (name, index) in self._shards, self.op_timeout):
                raise TimeoutError(
                    f"register '{name}' shard {index}: worker {rank} waited {self.op_timeout:g}s for worker 0 to "
                    "register it; every worker must register the same variables"
                )
            else:
                existing = self._shards[(name, index)]
        if existing is not shard:
            existing.check_same(shard.describe(), rank)
        elif self.saver is not None:
            self.saver.registered(shard)
        return Reply()

    def _layout(self, rank: int, request: Layout) -> LayoutReply:
        """Server 0 keeps every variable's layout (shape, dtype, rule, consistency, shards and their servers): a
        worker whose layout differs gets the first one's servers back, to stop them serving the variable."""
        name, layout = request.name, request.layout
        with self._lock:
            first = self._layouts.setdefault(name, layout)
        if first == layout:
            return LayoutReply()
        diff = first.differences(layout, "worker 0")
        message = (
            f"register '{name}': worker {rank} registered it with {'; '.join(diff)}; every worker must register the "
            "same variables (shape, dtype, rule, consistency) in the same order with the same partitioner"
        )
        return LayoutReply(message, name, tuple(sorted(set(first.servers))))

    def _poison(self, request: Poison) -> Reply:
        """A registration mismatch found elsewhere: every later request on this variable's shards raises it."""
        with self._lock:
            shards = [s for (n, _), s in self._shards.items() if n == request.name]
        for s in shards:
            s.poisoned = request.message
        return Reply()


def _per_variable(shards: list[Shard]) -> dict[str, int]:
    """The largest staleness seen per variable (over its shards on this server)."""
    out: dict[str, int] = {}
    for s in shards:
        out[s.name] = max(out.get(s.name, 0), s.max_staleness)
    return out


def _clocks(shards: list[Shard]) -> dict[str, list[int]]:
    """Each variable's pushes counted per worker (the fewest over its shards on this server)."""
    out: dict[str, list[int]] = {}
    for s in shards:
        with s.cond:
            clock = list(s.clock)
        out[s.name] = [min(a, b) for a, b in zip(out[s.name], clock)] if s.name in out else clock
    return out


def _waiting(shards: list[Shard]) -> dict[str, list[int]]:
    """The workers whose pull of a variable waits right now (bounded/sync), per variable."""
    out: dict[str, set[int]] = {}
    for s in shards:
        with s.cond:
            if s.waiting:
                out.setdefault(s.name, set()).update(s.waiting)
    return {k: sorted(v) for k, v in out.items()}
