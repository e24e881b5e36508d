"""The worker's side: :class:`Client` registers variables, pushes gradients and pulls values from the servers.

A variable is split into shards along axis 0 by a partitioner (:mod:`hora.ps.partition`), its shards placed on
the servers by bytes, and each operation is a list of requests (:mod:`hora.ps.messages`) per server holding its
shards, run on the servers at the same time (:mod:`hora.ps.server_links`). Arrays go on the wire from the caller's
memory and come back straight into the result, which is always a fresh array (or the caller's ``out``): nothing
returned aliases the client's buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hora.errors import ConfigError, MismatchError
from hora.ps import checkpoint
from hora.ps.consistency import parse_consistency
from hora.ps.messages import (
    HotRequest,
    Layout,
    LayoutReply,
    Load,
    Op,
    Poison,
    Register,
    Reply,
    Save,
    SaveReply,
    ShardSource,
    Stats,
    StatsReply,
    VariableLayout,
)
from hora.ps.partition import MinSizePartitioner, Partitioner, ShardKey, place, shard_offsets
from hora.ps.rows import sum_duplicates
from hora.ps.rules import UpdateRule, parse_rule
from hora.ps.server_link import OnReply, ServerLink, loopback
from hora.ps.server_links import PerServer, Request, ServerLinks

if TYPE_CHECKING:
    from hora.ps.reconnect import Restarts

__all__ = ["Client", "parse_consistency"]


@dataclass
class _Var:
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offsets: list[int]
    servers: list[int]

    def layout(self, rule: UpdateRule, mode: str, k: int) -> VariableLayout:
        return VariableLayout(
            self.shape, self.dtype.str, tuple(self.offsets), tuple(self.servers), rule, mode, k
        )


#: What ``_rows`` finds for a call's ids: the variable, its distinct ids (sorted), where each first appears, each
#: id's place among them, and where each shard's ids begin.
_Rows = tuple[_Var, np.ndarray, np.ndarray, np.ndarray, list[int]]


class Client:
    """A worker's connections to every parameter server of the job.

    Args:
        servers: ``(host, port)`` of each server, in server order.
        secret: the job secret; rank: this worker's rank (``0 <= rank < workers``).
        consistency: default of :meth:`register` (``async``, ``sync``, ``bounded(k)``).
        partitioner: default partitioner (TensorFlow's contract); default: shards of at least 1 MiB, at most one per
            server.
        timeout: seconds to connect, and beyond the servers' own op timeout, to wait for any reply.
        shm: move payloads through a shared segment (:mod:`hora.ps.segment`): one flag for every server, or one
            per server; default: for servers on a loopback address (this host). :func:`hora.ps.connect` passes one
            per server: those of this worker's host (``HORA_HOSTNAME``).
        restarts: reconnect to servers that ``hora run --max-restarts`` restarts and retry the failed operation
            (:mod:`hora.ps.reconnect`); default: a lost server raises :class:`PeerLostError`.
        single_copy: let servers on this host read gradients from and write values into this process's arrays
            (:mod:`hora.ps.cma`) where the kernel allows it; :func:`hora.ps.connect`: ``HORA_PS_SINGLE_COPY``.
    """

    def __init__(
        self,
        servers: Sequence[tuple[str, int]],
        secret: bytes,
        rank: int,
        consistency: str = "async",
        staleness: int | None = None,
        partitioner: Partitioner | None = None,
        timeout: float = 30.0,
        op_timeout: float = 300.0,
        shm: bool | Sequence[bool] | None = None,
        restarts: Restarts | None = None,
        single_copy: bool = True,
    ) -> None:
        if not servers:
            raise ConfigError("a parameter-server client needs at least one server (hora run --num-ps S)")
        self.rank = rank
        addresses = [(str(h), int(p)) for h, p in servers]
        self.mode, self.staleness = parse_consistency(consistency, staleness)
        self.partitioner = partitioner or MinSizePartitioner(1 << 20, max_shards=len(servers))
        self._vars: dict[str, _Var] = {}
        self._loads = [0] * len(servers)
        if shm is None or isinstance(shm, bool):
            use_segment = [bool(shm) if shm is not None else loopback(h) for h, _ in addresses]
        elif len(shm) == len(servers):
            use_segment = [bool(x) for x in shm]
        else:
            raise ConfigError(
                f"shm= has {len(shm)} flags for {len(servers)} servers; give one per server, or one bool"
            )
        self._scratch = threading.local()
        self._last_rows: tuple[_Var, np.ndarray, _Rows] | None = None
        self._servers = ServerLinks.open(
            addresses, use_segment, secret, rank, timeout, op_timeout, single_copy, restarts, self._held
        )
        self._run = self._servers.run  # every operation: its requests per server, run on the links

    @property
    def num_servers(self) -> int:
        return len(self._servers)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of each server now (a restarted server's new address)."""
        return [link.address for link in self._servers.links]

    @property
    def links(self) -> list[ServerLink]:
        """The connection to each server (:class:`~hora.ps.server_link.ServerLink`)."""
        return list(self._servers.links)

    @property
    def restarts(self) -> Restarts | None:
        """How a restarted server is reached (:mod:`hora.ps.reconnect`); None: a lost server is fatal."""
        return self._servers.restarts

    @property
    def shared_memory(self) -> list[bool]:
        """Per server, whether payloads go through shared memory (False from the first time it could not)."""
        return [link.use_segment for link in self._servers.links]

    def close(self) -> None:
        self._servers.close()

    def _held(self, server: int) -> list[str]:
        """The shards ``server`` holds (for the message when it is lost)."""
        return [
            f"'{n}' shard {i}" for n, v in self._vars.items() for i, s in enumerate(v.servers) if s == server
        ]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- registration ---------------------------------------------------------------------------------------------
    def register(
        self,
        name: str | Mapping[str, np.ndarray],
        value: np.ndarray | None = None,
        rule: str | Mapping[str, Any] | UpdateRule = "sgd",
        partitioner: Partitioner | None = None,
        consistency: str | None = None,
        staleness: int | None = None,
    ) -> None:
        """Create variables on the servers: ``register("w", array, rule=...)`` or ``register({"w": a, "b": b})``.

        Every worker registers the same variables in the same order; worker 0's values are the initial values (the
        others' registrations wait for worker 0's and are checked against it: another shape, dtype, rule,
        consistency or partitioning raises :class:`MismatchError`, on worker 0 too at its next request on the
        variable). The shards of one call are placed together, largest first, on the least-loaded servers.
        """
        values = dict(name) if isinstance(name, Mapping) else {name: value}
        rule = parse_rule(rule, "register")
        mode, k = (
            (self.mode, self.staleness) if consistency is None else parse_consistency(consistency, staleness)
        )
        part = partitioner or self.partitioner
        arrays: dict[str, np.ndarray] = {}
        keys: list[ShardKey] = []
        for n, v in values.items():
            if n in self._vars:
                raise ConfigError(f"register '{n}': this worker already registered a variable of that name")
            a = np.ascontiguousarray(v)
            if a.dtype not in (np.float32, np.float64):
                raise ConfigError(
                    f"register '{n}': dtype {a.dtype} is not supported; the servers hold float32 or float64"
                )
            if a.ndim == 0:
                a = a.reshape(1)
            arrays[n] = a
            shards = part(a.shape, a.dtype)[0] if a.shape[0] else 1
            offsets = shard_offsets(a.shape[0], shards)
            row = a[0].nbytes if a.shape[0] else 0
            keys += [ShardKey(n, i, (offsets[i + 1] - offsets[i]) * row) for i in range(len(offsets) - 1)]
            self._vars[n] = _Var(a.shape, a.dtype, offsets, [])
        placement = place(keys, self.num_servers, self._loads)
        for key in keys:
            self._vars[key.name].servers.append(placement[key])
            self._loads[placement[key]] += key.nbytes
        layouts: list[Request] = []
        per: dict[int, list[Request]] = {}
        for n, a in arrays.items():
            var = self._vars[n]
            layouts.append(Layout(n, var.layout(rule, mode, k)))
            for i, server in enumerate(var.servers):
                value = a[var.offsets[i] : var.offsets[i + 1]]
                per.setdefault(server, []).append(
                    Register(n, i, value.shape, a.dtype.str, rule, mode, k, value)
                )
        mismatch: list[tuple[str, str, tuple[int, ...]]] = []

        def note(reply: Reply) -> None:
            if isinstance(reply, LayoutReply) and reply.mismatch is not None:
                mismatch.append((reply.name, reply.mismatch, reply.servers))

        try:
            self._run({0: layouts}, lambda s: note)
            if mismatch:  # stop worker 0's shards too, so it raises at its next request on the variable
                bad, message, servers = mismatch[0]
                self._run({s: [Poison(bad, message)] for s in servers})
                raise MismatchError(message)
            self._run(per)
        except BaseException:
            for n in arrays:
                self._vars.pop(n, None)
            raise

    # -- dense ----------------------------------------------------------------------------------------------------
    def push(self, name: str, grad: np.ndarray) -> None:
        """Send ``grad`` (the variable's shape and dtype) to the servers, which apply the update rule."""
        self._run(self._dense(name, Op.PUSH, grad, None))

    def pull(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The variable's values (waiting as its consistency says); a fresh array, or ``out`` filled."""
        out = self._out(name, out)
        self._run(self._dense(name, Op.PULL, None, out))
        return out

    def push_pull(self, name: str, grad: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """:meth:`push` then :meth:`pull` in one round trip per server."""
        out = self._out(name, out)
        self._run(self._dense(name, Op.PUSH_PULL, grad, out))
        return out

    def _var(self, name: str, op: str) -> _Var:
        var = self._vars.get(name)
        if var is None:
            raise ConfigError(
                f"{op} '{name}': no such variable; register it first (known: {sorted(self._vars)[:10]})"
            )
        return var

    def _out(self, name: str, out: np.ndarray | None) -> np.ndarray:
        var = self._var(name, "pull")
        if out is None:
            return np.empty(var.shape, var.dtype)
        if out.shape != var.shape or out.dtype != var.dtype or not out.flags.c_contiguous:
            raise ConfigError(
                f"pull '{name}': out has shape {out.shape} and dtype {out.dtype}; it must be a C-contiguous "
                f"{var.dtype} array of shape {var.shape}"
            )
        return out

    def _dense(self, name: str, op: Op, grad: np.ndarray | None, out: np.ndarray | None) -> PerServer:
        var = self._var(name, str(op))
        g = None
        if grad is not None:
            g = np.asarray(grad)
            if g.shape != var.shape and g.size == int(np.prod(var.shape)):
                g = g.reshape(var.shape)
            if g.shape != var.shape:
                raise ConfigError(
                    f"{op} '{name}': the gradient has shape {g.shape}, the variable {var.shape}"
                )
            g = np.ascontiguousarray(g, var.dtype).reshape(-1, *var.shape[1:]) if var.shape else g
        flat_out = out.reshape(-1, *var.shape[1:]) if out is not None else None
        per: dict[int, list[Request]] = {}
        for i, server in enumerate(var.servers):
            lo, hi = var.offsets[i], var.offsets[i + 1]
            payload = (g[lo:hi],) if g is not None else ()
            into = flat_out[lo:hi] if flat_out is not None else None
            per.setdefault(server, []).append(HotRequest(op, name, i, payload, into))
        return per

    # -- sparse ---------------------------------------------------------------------------------------------------
    def _rows(self, name: str, op: str, ids: Any) -> _Rows:
        var = self._var(name, op)
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ConfigError(
                f"{op} '{name}': ids must be a 1-D integer array, got {ids.dtype} of shape {ids.shape}"
            )
        last = self._last_rows  # a step pulls rows and then pushes the same ids: sort them once
        if (
            last is not None
            and last[0] is var
            and last[1].shape == ids.shape
            and np.array_equal(last[1], ids)
        ):
            return last[2]
        uniq, first, inverse = np.unique(ids.astype(np.int64), return_index=True, return_inverse=True)
        if len(uniq) and (uniq[0] < 0 or uniq[-1] >= var.shape[0]):
            raise ConfigError(
                f"{op} '{name}': ids must lie in 0..{var.shape[0] - 1}, got {uniq[0]}..{uniq[-1]}"
            )
        cuts = np.searchsorted(uniq, var.offsets).tolist()
        result = (var, uniq, first, inverse.reshape(-1), cuts)
        self._last_rows = (var, ids.copy(), result)
        return result

    def pull_rows(self, name: str, ids: Any) -> np.ndarray:
        """Rows ``ids`` of the variable (duplicates allowed, fetched once), shape ``(len(ids), *row_shape)``."""
        var, uniq, _, inverse, cuts = self._rows(name, "pull_rows", ids)
        fetched = self._buffer(0, (len(uniq), *var.shape[1:]), var.dtype)  # reused: we return a gather of it
        per: dict[int, list[Request]] = {}
        for i, server in enumerate(var.servers):
            a, b = cuts[i], cuts[i + 1]
            if a < b:
                local = (uniq[a:b] - var.offsets[i]).astype("<i8")
                per.setdefault(server, []).append(
                    HotRequest(Op.PULL_ROWS, name, i, (local,), fetched[a:b], b - a)
                )
        self._run(per)
        # a new array (fetched is reused); np.take is faster than []
        return np.take(fetched, inverse, axis=0, mode="clip")

    def push_rows(self, name: str, ids: Any, grads: np.ndarray) -> None:
        """Gradients of rows ``ids`` (duplicates are summed here, so each row crosses the wire once)."""
        var, uniq, first, inverse, cuts = self._rows(name, "push_rows", ids)
        g = np.asarray(grads, var.dtype)
        if g.shape != (len(inverse), *var.shape[1:]):
            raise ConfigError(
                f"push_rows '{name}': grads have shape {g.shape}, expected {(len(inverse), *var.shape[1:])}"
            )
        summed = self._buffer(1, (len(uniq), *var.shape[1:]), var.dtype)
        sum_duplicates(inverse, len(uniq), g, out=summed, first=first)
        per: dict[int, list[Request]] = {}
        for i, server in enumerate(var.servers):
            a, b = cuts[i], cuts[i + 1]
            if a < b:
                local = (uniq[a:b] - var.offsets[i]).astype("<i8")
                per.setdefault(server, []).append(
                    HotRequest(Op.PUSH_ROWS, name, i, (local, summed[a:b]), None, b - a)
                )
        self._run(per)

    def _buffer(self, slot: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A reused scratch array of this thread (a fresh megabyte costs ~0.6 ms of page faults here)."""
        pool = self._scratch.__dict__.setdefault("pool", {})
        nbytes = int(np.prod(shape)) * dtype.itemsize
        buf = pool.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = pool[slot] = np.empty(max(nbytes, 1 << 16), np.uint8)
        return buf[:nbytes].view(dtype).reshape(shape)

    # -- reports and checkpoints ----------------------------------------------------------------------------------
    def stats(self, progress: bool = False) -> list[dict[str, Any]]:
        """Every server's counters: bytes stored, in and out, the largest staleness seen (``max_staleness``, and
        per variable in ``staleness``), rejected connections; with ``progress``, also per variable each worker's
        pushes (``clocks``) and the workers whose pull waits now (``waiting``)."""
        replies: dict[int, dict[str, Any]] = {}

        def keep(server: int) -> OnReply:
            def put(reply: Reply) -> None:
                assert isinstance(reply, StatsReply)
                replies[server] = reply.stats

            return put

        self._run({s: [Stats(progress)] for s in range(self.num_servers)}, keep)
        return [replies[s] for s in range(self.num_servers)]

    def balance(self) -> dict[str, Any]:
        """Bytes stored per server and max/mean, as the servers count them."""
        per = [s["bytes_stored"] for s in self.stats()]
        mean = sum(per) / len(per)
        return {"bytes": per, "max_over_mean": max(per) / mean if mean else 1.0}

    def placement(self, name: str) -> list[tuple[int, int, int]]:
        """(first row, end row, server) of each shard of ``name``."""
        var = self._var(name, "placement")
        return [(var.offsets[i], var.offsets[i + 1], s) for i, s in enumerate(var.servers)]

    def save(self, directory: str, step: int = 0) -> None:
        """Checkpoint every variable: each server writes its shards, then this worker writes the manifest."""
        files: dict[tuple[str, int], str] = {}

        def keep(reply: Reply) -> None:
            assert isinstance(reply, SaveReply)
            for f in reply.files:
                files[(f.name, f.shard)] = f.file

        self._run({s: [Save(directory)] for s in range(self.num_servers)}, lambda s: keep)
        variables = {
            n: {
                "shape": list(v.shape),
                "dtype": v.dtype.str,
                "offsets": v.offsets,
                "files": [files[(n, i)] for i in range(len(v.servers))],
            }
            for n, v in self._vars.items()
        }
        checkpoint.write_manifest(directory, {"format": 1, "step": step, "variables": variables})

    def restore(self, directory: str) -> int:
        """Load a checkpoint into the registered variables (any number of servers and shards); returns its step."""
        manifest = checkpoint.read_manifest(directory)
        per: dict[int, list[ShardSource]] = {}
        for n, v in self._vars.items():
            old = manifest["variables"].get(n)
            if old is None or tuple(old["shape"]) != v.shape:
                raise ConfigError(
                    f"restore: the checkpoint in {directory} has no variable '{n}' of shape {v.shape}"
                )
            for i, pieces in enumerate(checkpoint.reshard_sources(old, v.offsets)):
                per.setdefault(v.servers[i], []).append(ShardSource(n, i, tuple(pieces)))
        self._run({s: [Load(directory, tuple(src))] for s, src in per.items()})
        return int(manifest.get("step", 0))
