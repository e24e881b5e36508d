"""Assembling a group of ranks: what ``init()`` does for every rank and ``add_process_set`` for a set's members
(and, later, what parameter-server groups will do).

A group is N members that find each other through a :class:`Directory` (the launcher's rendezvous store at start-up,
the global group's own collectives for a process set), then connect (every worker dials the group's first member
for control; on TCP every member dials the lower ones for data), build their transport (shared memory, a TCP ring,
or hierarchical) and start an engine::

    peers     every member publishes a Peer (host, pid, listener address, ...) and reads everyone's
    connect   control connections to member 0; a TCP mesh when the transport needs one
    transport shared memory: the creator makes the segment, barrier, the others attach, barrier, unlink
    ready     a last barrier; then the engine starts

Every participant of the directory runs the same sequence of directory calls, members and non-members alike (a
process set's non-members take part in the global collectives the set's directory is made of).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

from hora._engine.engine import Engine, EngineSettings
from hora._engine.negotiation import format_ranks
from hora._proc import process_start_time
from hora._runtime.auth import Role
from hora._runtime.connections import PeerListener, close_all, connect_peers
from hora._runtime.peers import Directory, Peer, Topology
from hora._runtime.transports import build_transport, choose_transport, kernel_id
from hora._transport.base import SelfTransport
from hora.config import Config
from hora.errors import ConfigError

__all__ = ["Group", "GroupSpec", "assemble"]


@dataclass
class Group:
    """An assembled group as this member sees it: its engine, its members and where they run."""

    set_id: int  # 0 for the global group, the process set's id otherwise
    ranks: tuple[int, ...]  # the members' global ranks
    rank: int  # this member's index
    size: int
    engine: Engine
    peers: tuple[Peer, ...]
    topology: Topology
    transport: str  # "self", "shm", "tcp" or "hierarchical"
    _names: dict[str, int] = field(default_factory=dict)

    def auto_name(self, kind: str) -> str:
        """Deterministic names for unnamed collectives: the n-th unnamed allreduce is the same on every member."""
        n = self._names.get(kind, 0)
        self._names[kind] = n + 1
        return f"{kind}.noname.{n}"


@dataclass(frozen=True)
class GroupSpec:
    """What every participant of one assembly agrees on."""

    config: Config
    ranks: tuple[int, ...]  # the members' global ranks (their index is their rank in the group)
    name: str  # unique among this job's groups: names the shared-memory segments
    secret: bytes
    job_id: str
    source: str = "hora"  # the launcher, for messages
    set_id: int = 0
    hierarchical: bool = True  # may a multi-host group use the hierarchical transport


def assemble(
    spec: GroupSpec,
    directory: Directory,
    me: int | None,
    *,
    hostname: str,
    bind_addr: str,
    deadline: float,
    local_hint: tuple[int | None, int | None] = (None, None),
) -> Group | None:
    """Assemble the group; ``me`` is this participant's member index, None for a non-member (which takes part in
    the directory calls and returns None)."""
    size = len(spec.ranks)
    config = spec.config
    if size == 1:  # nothing to exchange: every participant knows it
        if me is None:
            return None
        peer = Peer(hostname, os.getpid(), process_start_time(os.getpid()), "", 0, kernel_id())
        return _group(spec, 0, {}, SelfTransport(), "self", (peer,), Topology.single(hostname))
    cleanup: list[Any] = []
    try:
        listener = None
        mine = None
        if me is not None:
            listener = PeerListener(bind_addr, spec.secret, config.port_range)
            cleanup.append(listener)
            mine = Peer(
                hostname,
                os.getpid(),
                process_start_time(os.getpid()),
                *listener.address,
                kernel_id(),
                local_hint,
                config.fusion_threshold,
                config.cache_capacity,
            ).to_wire()
        peers = [Peer.from_wire(p) for p in directory.allgather("peers", mine)]
        hosts = list(dict.fromkeys(p.host for p in peers))
        transport = choose_transport(config, hosts, size, spec.hierarchical)
        mesh = transport in ("tcp", "hierarchical")  # the flat ring over every member; lanes share its sockets
        control: dict[int, socket.socket] = {}
        data: dict[int, socket.socket] = {}
        topology: Topology | None = None
        if me is not None:
            assert listener is not None
            _check_engine_settings(peers, spec.ranks)
            topology = Topology.of(peers, me, spec.source)
            control, data = _connect(spec, listener, peers, me, mesh, deadline, cleanup)
        labels = [f"rank {r} (host {p.host})" for r, p in zip(spec.ranks, peers)]
        built = build_transport(
            transport, config, directory, peers, me, data, spec.name, spec.job_id, labels, deadline
        )
        if built is not None:
            cleanup.append(built)
        directory.barrier("ready")
        if listener is not None:
            listener.close()
        if me is None:
            return None
        assert built is not None and topology is not None
        return _group(spec, me, control, built, transport, tuple(peers), topology)
    except BaseException:
        close_all(cleanup)
        raise


def _connect(
    spec: GroupSpec,
    listener: PeerListener,
    peers: list[Peer],
    me: int,
    mesh: bool,
    deadline: float,
    cleanup: list[Any],
) -> tuple[dict[int, socket.socket], dict[int, socket.socket]]:
    """Control connections (every worker to member 0) and, for ``mesh``, data connections (each to the lower)."""
    size = len(peers)
    expected: set[tuple[Role, int]] = set()
    if me == 0:
        expected |= {(Role.CONTROL, r) for r in range(1, size)}
    if mesh:
        expected |= {(Role.DATA, r) for r in range(me + 1, size)}
    listener.start_accepting(expected, deadline)
    first = peers[0]
    dialed_control = connect_peers(
        [(0, first.addr, first.port)] if me else [], Role.CONTROL, me, spec.secret, deadline
    )
    cleanup.extend(dialed_control.values())
    dialed_data = connect_peers(
        [(r, peers[r].addr, peers[r].port) for r in range(me)] if mesh else [], Role.DATA, me, spec.secret, deadline
    )
    cleanup.extend(dialed_data.values())
    accepted = listener.wait()
    cleanup.extend(accepted.values())
    control = dialed_control or {r: s for (role, r), s in accepted.items() if role is Role.CONTROL}
    data = {**dialed_data, **{r: s for (role, r), s in accepted.items() if role is Role.DATA}}
    return control, data


def _group(
    spec: GroupSpec,
    me: int,
    control: dict[int, socket.socket],
    transport: Any,
    kind: str,
    peers: tuple[Peer, ...],
    topology: Topology,
) -> Group:
    if spec.set_id:
        describe = {
            i: f"rank {r} (set rank {i} of process set {spec.set_id}; host {p.host}, pid {p.pid})"
            for i, (r, p) in enumerate(zip(spec.ranks, peers))
        }
    else:
        describe = {r: f"rank {r} (host {p.host}, pid {p.pid})" for r, p in zip(spec.ranks, peers)}
    settings = EngineSettings(spec.config)
    settings.autotune = settings.autotune and not spec.set_id  # the global engine tunes; process sets keep theirs
    engine = Engine(me, len(spec.ranks), transport, control, settings, describe)
    engine.start()
    return Group(spec.set_id, spec.ranks, me, len(spec.ranks), engine, peers, topology, kind)


def _check_engine_settings(peers: list[Peer], ranks: tuple[int, ...]) -> None:
    """Every member must fuse and cache alike: they compute the same groups and exchange vectors of one length."""
    for label, names, value in [
        ("fusion threshold", "HORA_FUSION_THRESHOLD / HOROVOD_FUSION_THRESHOLD", lambda p: p.fusion_threshold),
        ("cache capacity", "HORA_CACHE_CAPACITY / HOROVOD_CACHE_CAPACITY", lambda p: p.cache_capacity),
    ]:
        groups: dict[int, list[int]] = {}
        for r, p in zip(ranks, peers):
            groups.setdefault(value(p), []).append(r)
        if len(groups) > 1:
            parts = [f"{v} on {format_ranks(rs)}" for v, rs in groups.items()]
            raise ConfigError(
                f"the ranks disagree on the {label}: {' but '.join(parts)}; set {names} alike for every rank"
            )

