"""Building a job's data plane at start-up: which transport, the shared-memory segment of a host, and the
hierarchical plane of a multi-host job (shared memory within each host, TCP lanes across hosts)."""

from __future__ import annotations

import socket
import time
from typing import Any

from hora._engine.engine import exchange_row_bytes
from hora._runtime.bootstrap import Bootstrap
from hora._runtime.rendezvous import RendezvousClient, _MissingKeys
from hora._transport.base import DataPlane, SelfPlane
from hora._transport.hierarchical import HierarchicalPlane
from hora._transport.shm import ShmPlane, job_prefix
from hora._transport.tcp import TcpPlane
from hora.config import Config
from hora.errors import ConfigError, RendezvousError

__all__ = ["choose_transport", "hierarchical_plane", "kernel_id", "left", "shm_plane", "store_barrier"]


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (a time.monotonic() value), never negative."""
    return max(0.0, deadline - time.monotonic())


def choose_transport(config: Config, hosts: list[str], size: int) -> str:
    if config.transport == "shm" and len(hosts) > 1:
        raise ConfigError(
            f"HORA_TRANSPORT=shm needs every rank on one host, but ranks run on {len(hosts)} hosts "
            f"({', '.join(hosts)}); use tcp or auto."
        )
    if config.transport == "auto":
        if len(hosts) == 1:
            return "shm"
        if size == len(hosts):  # one rank per host: no step within a host, the flat ring is the same algorithm
            return "tcp"
        return "hierarchical" if config.hierarchical_allreduce or config.hierarchical_allgather else "tcp"
    return config.transport


def kernel_id() -> str:
    """This kernel's boot id: ranks reporting different host names but the same id share one machine's cores
    (fake host names, network-namespace "hosts"), which decides whether shared-memory waits may spin."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def store_barrier(store: RendezvousClient, key: str, n: int, deadline: float, rank: int) -> None:
    store.add(key, 1)
    try:
        store.wait([key], left(deadline), at_least=n)
    except _MissingKeys:
        raise RendezvousError(
            f"rank {rank}: not every rank finished start-up ('{key}') before the start timeout; "
            "another rank probably failed — see its error"
        ) from None


def shm_plane(
    config: Config,
    store: RendezvousClient,
    boot: Bootstrap,
    peers: list[dict[str, Any]],
    rank: int,
    size: int,
    generation: int,
    deadline: float,
    group: list[int] | None = None,
    host_index: int | None = None,
    busy_processes: int = 0,
) -> ShmPlane:
    """The shared-memory plane of the ranks ``group`` (default: every rank), whose local rank 0 creates it.

    In a multi-host job every host has its own segment, named and keyed by the host's index, so hosts that are
    really one machine (fake host names in tests) never share one."""
    group = list(range(size)) if group is None else group
    suffix = "" if host_index is None else f"-h{host_index}"
    name = f"{job_prefix(boot.job_id)}{config.attempt}-{generation}{suffix}"
    me, n = group.index(rank), len(group)
    pids = [(int(peers[r]["pid"]), int(peers[r]["start"])) for r in group]
    labels = [f"rank {r}" if host_index is None else f"rank {r} (host {peers[r]['host']})" for r in group]
    # the engine's exchange rows live in the segment only where the segment is the whole job's plane
    exchange = exchange_row_bytes(config.cache_capacity, n) if host_index is None else 0
    plane: ShmPlane | None = None
    try:
        if me == 0:
            plane = ShmPlane(
                name, 0, n, config.shm_chunk_bytes, pids, config.op_timeout, True, exchange, labels,
                busy_processes,
            )
            store.set(f"shm{suffix}", name)
        else:
            store.wait([f"shm{suffix}"], left(deadline))
            plane = ShmPlane(
                name, me, n, config.shm_chunk_bytes, pids, config.op_timeout, False, exchange, labels,
                busy_processes,
            )
        store_barrier(store, f"shm-attached{suffix}", n, deadline, rank)
    except BaseException:
        if plane is not None:
            plane.close()
        raise
    plane.unlink()  # every rank has it mapped: from now on a crash cannot leak the segment
    return plane


def hierarchical_plane(
    config: Config,
    store: RendezvousClient,
    boot: Bootstrap,
    peers: list[dict[str, Any]],
    topo: dict[str, Any],
    rank: int,
    flat: TcpPlane,
    data: dict[int, socket.socket],
    generation: int,
    deadline: float,
) -> HierarchicalPlane:
    """Shared memory among this host's ranks, this rank's lane (a TCP ring among the ranks with its local rank,
    one per host, over sockets of the flat mesh) and the flat ring; see :mod:`hora._transport.hierarchical`."""
    hosts: list[list[int]] = topo["local"]
    host = next(h for h, rs in enumerate(hosts) if rank in rs)
    group, local_rank = hosts[host], hosts[host].index(rank)
    local: DataPlane = SelfPlane()
    if len(group) > 1:
        kernel = peers[rank].get("kernel")
        sharing = sum(1 for p in peers if kernel and p.get("kernel") == kernel)  # ranks on this machine's cores
        local = shm_plane(
            config, store, boot, peers, rank, len(peers), generation, deadline, group, host, sharing
        )
    lane: TcpPlane | None = None
    try:
        if local_rank < min(len(rs) for rs in hosts):
            members = [rs[local_rank] for rs in hosts]  # lane index = host index
            lane = TcpPlane(
                host,
                len(hosts),
                {i: data[r] for i, r in enumerate(members) if r != rank},
                config.tcp_chunk_bytes,
                config.op_timeout,
                {i: f"rank {r} (host {peers[r]['host']})" for i, r in enumerate(members)},
            )
        return HierarchicalPlane(
            rank,
            len(peers),
            hosts,
            local,
            lane,
            flat,
            config.hierarchical_allreduce,
            config.hierarchical_allgather,
        )
    except BaseException:
        local.close()
        if lane is not None:
            lane.close()
        raise
