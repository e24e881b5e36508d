"""Building a group's transport: which one, the shared-memory segments of a host, and the hierarchical transport of
a multi-host group (shared memory within each host, TCP lanes across hosts)."""

from __future__ import annotations

import socket
import time

from hora._engine.exchange import exchange_row_bytes
from hora._runtime.peers import Directory, Peer
from hora._transport.base import SelfTransport, Transport
from hora._transport.hierarchical import HierarchicalTransport
from hora._transport.shm import ShmTransport, job_prefix
from hora._transport.tcp import TcpTransport
from hora.config import Config
from hora.errors import ConfigError

__all__ = ["build_transport", "choose_transport", "kernel_id", "left"]


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (a time.monotonic() value), never negative."""
    return max(0.0, deadline - time.monotonic())


def choose_transport(config: Config, hosts: list[str], size: int, hierarchical: bool = True) -> str:
    """``shm``, ``tcp`` or ``hierarchical`` for a group of ``size`` members on ``hosts``, as the settings say;
    ``hierarchical=False`` keeps a multi-host group on the flat ring (process sets)."""
    if config.transport == "shm" and len(hosts) > 1:
        raise ConfigError(
            f"HORA_TRANSPORT=shm needs every rank on one host, but ranks run on {len(hosts)} hosts "
            f"({', '.join(hosts)}); use tcp or auto."
        )
    if config.transport == "auto":
        if len(hosts) == 1:
            return "shm"
        if size == len(hosts) or not hierarchical:  # one rank per host: the flat ring is the same algorithm
            return "tcp"
        # autotune switches hierarchical allreduce/allgather on and off, which only the hierarchical transport can
        tunable = config.autotune
        return "hierarchical" if config.hierarchical_allreduce or config.hierarchical_allgather or tunable else "tcp"
    return config.transport


def kernel_id() -> str:
    """This kernel's boot id: ranks reporting different host names but the same id share one machine's cores
    (fake host names, network-namespace "hosts"), which decides whether shared-memory waits may spin."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def build_transport(
    kind: str,
    config: Config,
    directory: Directory,
    peers: list[Peer],
    me: int | None,
    data: dict[int, socket.socket],
    name: str,
    job_id: str,
    labels: list[str],
    deadline: float,
) -> Transport | None:
    """This member's transport of ``kind`` (None for a non-member, which still takes part in the directory's
    barriers). ``data``: the TCP mesh's sockets by member; ``labels``: how errors name each member."""
    size = len(peers)
    segment = f"{job_prefix(job_id)}{name}"
    if kind == "shm":
        pids = [(p.pid, p.start) for p in peers]
        exchange = exchange_row_bytes(config.cache_capacity, size)  # the engine's exchange rows live in it
        made = _shared_segments(config, directory, me, [(segment, list(range(size)), pids, exchange, labels, 0)])
        return made[0] if me is not None else None
    if kind == "tcp":
        if me is None:
            return None
        return TcpTransport(me, size, data, config.tcp_chunk_bytes, config.op_timeout, dict(enumerate(labels)))
    if kind == "hierarchical":
        return _hierarchical(config, directory, peers, me, data, segment, labels)
    raise ConfigError(f"unknown transport {kind!r}")  # pragma: no cover - choose_transport decides


def _shared_segments(
    config: Config,
    directory: Directory,
    me: int | None,
    segments: list[tuple[str, list[int], list[tuple[int, int]], int, list[str], int]],
) -> list[ShmTransport]:
    """Make the shared-memory ``segments`` (name, members, (pid, start) per member, exchange bytes, labels, busy
    processes): each one's first member creates it, a barrier, the others attach, a barrier, every name is
    unlinked (from then on a crash cannot leak a segment). Returns this member's segments."""
    mine: list[ShmTransport] = []
    try:
        for seg, members, pids, exchange, seg_labels, busy in segments:
            if me is not None and members[0] == me:
                mine.append(
                    ShmTransport(
                        seg,
                        0,
                        len(members),
                        config.shm_chunk_bytes,
                        pids,
                        config.op_timeout,
                        True,
                        exchange,
                        seg_labels,
                        busy,
                    )
                )
        directory.barrier("shm-created")
        for seg, members, pids, exchange, seg_labels, busy in segments:
            if me is not None and me in members[1:]:
                mine.append(
                    ShmTransport(
                        seg,
                        members.index(me),
                        len(members),
                        config.shm_chunk_bytes,
                        pids,
                        config.op_timeout,
                        False,
                        exchange,
                        seg_labels,
                        busy,
                    )
                )
        directory.barrier("shm-attached")
    except BaseException:
        for t in mine:
            t.close()
        raise
    for t in mine:
        t.unlink()
    return mine


def _hierarchical(
    config: Config,
    directory: Directory,
    peers: list[Peer],
    me: int | None,
    data: dict[int, socket.socket],
    segment: str,
    labels: list[str],
) -> HierarchicalTransport | None:
    """Shared memory among each host's members (one segment per host with several), this member's lane (a TCP ring
    among the members with its local rank, one per host, over sockets of the flat mesh) and the flat ring; see
    :mod:`hora._transport.hierarchical`."""
    hosts_members = [[r for r, p in enumerate(peers) if p.host == h] for h in dict.fromkeys(p.host for p in peers)]
    segments = []
    for index, members in enumerate(hosts_members):
        if len(members) > 1:
            kernel = peers[members[0]].kernel
            sharing = sum(1 for p in peers if kernel and p.kernel == kernel)  # members on this machine's cores
            pids = [(peers[r].pid, peers[r].start) for r in members]
            # host segments carry no exchange rows: the engine exchanges through allreduce here
            segments.append((f"{segment}-h{index}", members, pids, 0, [labels[r] for r in members], sharing))
    made = _shared_segments(config, directory, me, segments)
    if me is None:
        return None
    size = len(peers)
    flat = TcpTransport(me, size, data, config.tcp_chunk_bytes, config.op_timeout, dict(enumerate(labels)))
    host = next(h for h, rs in enumerate(hosts_members) if me in rs)
    local: Transport = made[0] if made else SelfTransport()
    lane: TcpTransport | None = None
    try:
        local_rank = hosts_members[host].index(me)
        if local_rank < min(len(rs) for rs in hosts_members):
            members = [rs[local_rank] for rs in hosts_members]  # lane index = host index
            lane = TcpTransport(
                host,
                len(hosts_members),
                {i: data[r] for i, r in enumerate(members) if r != me},
                config.tcp_chunk_bytes,
                config.op_timeout,
                {i: labels[r] for i, r in enumerate(members)},
            )
        return HierarchicalTransport(
            me, size, hosts_members, local, lane, flat, config.hierarchical_allreduce, config.hierarchical_allgather
        )
    except BaseException:
        local.close()
        if lane is not None:
            lane.close()
        flat.close()
        raise

