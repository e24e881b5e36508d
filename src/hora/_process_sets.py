"""Process sets: collectives among a subset of the ranks, negotiated independently of the other sets.

Every set is an engine of its own among its members: its own control connections (to the set's first rank, its
coordinator), its own data plane (a shared-memory segment, or TCP connections, like the global set's) and its own
engine thread, so a collective on one set never waits for another set's. Creating or removing a set is a
collective of every rank (as in Horovod): all ranks call ``add_process_set`` with the same ranks, in the same
order; the members' addresses are exchanged through the global set's authenticated collectives.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hora._engine.engine import Engine, EngineSettings, exchange_row_bytes
from hora._runtime.auth import Role
from hora._runtime.connections import PeerListener, close_all, connect_peers
from hora._runtime.context import Context, current
from hora._transport.base import DataPlane, SelfPlane
from hora._transport.shm import ShmPlane, job_prefix
from hora._transport.tcp import TcpPlane
from hora.errors import ConfigError

__all__ = [
    "ProcessSet",
    "SetContext",
    "active",
    "add_process_set",
    "global_process_set",
    "remove_process_set",
    "scope",
    "set_root",
    "using",
]


@dataclass
class SetContext:
    """What the frontend needs of a context (``engine``, ``rank``, ``size``, ``auto_name``), for one set."""

    set_id: int
    ranks: list[int]
    rank: int
    size: int
    engine: Engine
    _names: dict[str, int] = field(default_factory=dict)

    def auto_name(self, kind: str) -> str:
        n = self._names.get(kind, 0)
        self._names[kind] = n + 1
        return f"{kind}.noname.{n}"


_active_set: contextvars.ContextVar[int | None] = contextvars.ContextVar("hora_process_set", default=None)


@contextlib.contextmanager
def using(set_id: int | None) -> Iterator[None]:
    """Collectives started inside run on process set ``set_id`` (None or 0: the global set)."""
    token = _active_set.set(set_id or None)
    try:
        yield
    finally:
        _active_set.reset(token)


def active() -> Context | SetContext:
    """The context collectives run in now: the global one, or the active process set's (members only)."""
    ctx = current()
    set_id = _active_set.get()
    if set_id is None:
        return ctx
    sub = ctx.sets.get(set_id)
    if sub is None:
        raise ConfigError(
            f"rank {ctx.rank} is not a member of process set {set_id} (or the set was removed): only its member "
            "ranks may run collectives on it"
        )
    return sub


def _add(ranks: Sequence[int]) -> tuple[int, list[int]]:
    """Create a process set of ``ranks``; every rank must call this with the same ranks. Returns (id, ranks)."""
    from hora import _frontend as f  # the global set's collectives

    ctx = current()
    members = sorted({int(r) for r in ranks})
    if not members or members[0] < 0 or members[-1] >= ctx.size:
        raise ValueError(f"a process set needs ranks in 0..{ctx.size - 1}, got {list(ranks)}")
    set_id = ctx.next_set_id
    tag = f"hora.process_set.{set_id}"
    with using(None):
        everyone = f.allgather_object(members, name=f"{tag}.ranks")
    if any(other != members for other in everyone):
        groups: dict[str, list[int]] = {}
        for r, other in enumerate(everyone):
            groups.setdefault(str(other), []).append(r)
        got = "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))} passed {m}"
                        for m, rs in groups.items())  # fmt: skip
        raise ValueError(f"add_process_set must be called by every rank with the same ranks; got {got}")
    if members == list(range(ctx.size)) or members in ctx.set_ranks.values():
        raise ValueError(f"a process set of ranks {members} already exists; add_process_set takes a new set of ranks")
    ctx.next_set_id += 1
    ctx.set_ranks[set_id] = members
    member = ctx.rank in members
    me = members.index(ctx.rank) if member else -1
    n = len(members)
    deadline = time.monotonic() + ctx.config.start_timeout
    cleanup: list[Any] = []
    try:
        listener = None
        plane: DataPlane | None = None
        shm_name = f"{job_prefix(ctx.job_id)}{ctx.config.attempt}-{ctx.generation}-ps{set_id}"
        pids = [(int(ctx.peers[r]["pid"]), int(ctx.peers[r]["start"])) for r in members] if ctx.peers else []
        shm = ctx.transport == "shm" and n > 1
        exchange = exchange_row_bytes(ctx.config.cache_capacity, n)
        if member and n > 1:
            listener = PeerListener(ctx.bind_addr, ctx.secret, ctx.config.port_range)
            cleanup.append(listener)
            if shm and me == 0:  # created before the exchange below, so it exists when the others attach
                plane = ShmPlane(shm_name, 0, n, ctx.config.shm_chunk_bytes, pids, ctx.config.op_timeout, True,
                                 exchange)  # fmt: skip
                cleanup.append(plane)
        info = list(listener.address) if listener is not None else None
        with using(None):
            addrs = f.allgather_object(info, name=f"{tag}.addresses")
        if member and n > 1:
            assert listener is not None
            expected: set[tuple[Role, int]] = set()
            if me == 0:
                expected |= {(Role.CONTROL, r) for r in range(1, n)}
            if not shm:
                expected |= {(Role.DATA, r) for r in range(me + 1, n)}
            listener.start_accepting(expected, deadline)
            first = addrs[members[0]]
            control = connect_peers([(0, first[0], first[1])] if me else [], Role.CONTROL, me, ctx.secret, deadline)
            cleanup.extend(control.values())
            dialed = {}
            if not shm:
                targets = [(r, addrs[members[r]][0], addrs[members[r]][1]) for r in range(me)]
                dialed = connect_peers(targets, Role.DATA, me, ctx.secret, deadline)
                cleanup.extend(dialed.values())
            accepted = listener.wait()
            cleanup.extend(accepted.values())
            control = control or {r: s for (role, r), s in accepted.items() if role is Role.CONTROL}
            if shm:
                if plane is None:
                    plane = ShmPlane(shm_name, me, n, ctx.config.shm_chunk_bytes, pids, ctx.config.op_timeout,
                                     False, exchange)  # fmt: skip
                    cleanup.append(plane)
            else:
                data = {**dialed, **{r: s for (role, r), s in accepted.items() if role is Role.DATA}}
                plane = TcpPlane(me, n, data, ctx.config.tcp_chunk_bytes, ctx.config.op_timeout)
                cleanup.append(plane)
        with using(None):
            f.barrier()  # every member has attached: the segment's name can go
        if isinstance(plane, ShmPlane):
            plane.unlink()
        if listener is not None:
            listener.close()
        if member:
            describe = {
                i: f"rank {r} (set rank {i} of process set {set_id}; host {ctx.peers[r]['host']}, pid "
                f"{ctx.peers[r]['pid']})"
                for i, r in enumerate(members)
            } if ctx.peers else {}  # fmt: skip
            engine = Engine(me, n, plane or SelfPlane(), control if n > 1 else {}, EngineSettings(ctx.config),
                            describe)  # fmt: skip
            engine.start()
            ctx.sets[set_id] = SetContext(set_id, members, me, n, engine)
    except BaseException:
        close_all(cleanup)
        raise
    return set_id, members


def _remove(set_id: int) -> bool:
    """Remove a process set; every rank must call this. Returns False when no such set exists."""
    from hora import _frontend as f

    ctx = current()
    with using(None):
        everyone = f.allgather_object(set_id, name=f"hora.process_set.remove.{set_id}")
    if any(other != set_id for other in everyone):
        raise ValueError(f"remove_process_set must be called by every rank for the same set; got {everyone}")
    sub = ctx.sets.pop(set_id, None)
    if sub is not None:
        sub.engine.shutdown()
    return ctx.set_ranks.pop(set_id, None) is not None


# -- Horovod's API (``horovod/common/process_sets.py``), shared by the framework adapters -------------------------------
class ProcessSet:
    """A group of ranks that collectives can run within (``process_set=``), negotiated independently of the other
    sets. Create with ``ProcessSet([0, 2])`` and register it with ``add_process_set`` (every rank calls it) or pass
    it to ``init(process_sets=[...])``. As in Horovod, ``size()``, ``rank()`` and ``included()`` are None until the
    set is registered (``process_set_id`` set); ``rank()`` is the index of this rank within the set."""

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise TypeError(
                f"ProcessSet takes a list of ranks, got {type(ranks_or_comm).__name__} (hora does not use MPI "
                "communicators)"
            )
        self.ranks: list[int] = sorted({int(r) for r in ranks_or_comm})
        self.process_set_id: int | None = None

    def _members(self) -> list[int]:
        return self.ranks

    def size(self) -> int | None:
        return None if self.process_set_id is None else len(self._members())

    def rank(self) -> int | None:
        """This rank's index within the set; ValueError on a rank outside it (check ``included()`` first)."""
        if self.process_set_id is None:
            return None
        me = current().rank
        members = self._members()
        if me not in members:
            raise ValueError(f"rank {me} is not a member of {self!r}")
        return members.index(me)

    def included(self) -> bool | None:
        return None if self.process_set_id is None else current().rank in self._members()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and (self._members(), self.process_set_id) == (
            other._members(),
            other.process_set_id,
        )

    def __hash__(self) -> int:
        return hash((tuple(self._members()), self.process_set_id))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self._members()})"


class _GlobalProcessSet(ProcessSet):
    """Every rank (``process_set_id`` 0); its ``ranks`` follow the running job."""

    def __init__(self) -> None:
        self.process_set_id = 0

    @property
    def ranks(self) -> list[int]:  # type: ignore[override]
        return self._members()

    def _members(self) -> list[int]:
        from hora._runtime.context import is_initialized

        return list(range(current().size)) if is_initialized() else []


global_process_set: ProcessSet = _GlobalProcessSet()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of ranks). Every rank must call this with the same ranks, in
    the same order as its other ``add_process_set`` calls; ranks outside the set take part in creating it too."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps!r} was already added")
    set_id, ranks = _add(ps.ranks)
    ps.ranks, ps.process_set_id = ranks, set_id
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a process set added before (every rank calls this). Returns False if it was not registered."""
    if process_set.process_set_id == 0:
        raise ValueError("the global process set cannot be removed")
    if process_set.process_set_id is None:
        return False
    removed = _remove(process_set.process_set_id)
    process_set.process_set_id = None
    return removed


def scope(process_set: ProcessSet | None) -> contextlib.AbstractContextManager[None]:
    """Run the collectives started inside on ``process_set`` (None: the global set)."""
    if process_set is None or process_set.process_set_id == 0:
        return contextlib.nullcontext()
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set!r} has not been added: call hvd.add_process_set(...) on every rank first")
    return using(process_set.process_set_id)


def set_root(process_set: ProcessSet | None, root_rank: int) -> int:
    """A root rank (a global rank, as in Horovod) as the set's own index."""
    if process_set is None or process_set.process_set_id == 0:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set!r}")
    return process_set.ranks.index(root_rank)
