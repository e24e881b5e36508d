"""The per-process hora context: ``init()`` / ``shutdown()`` and the topology queries.

``init()`` resolves the settings, finds out which launcher started the process, meets the other ranks at the
rendezvous store, computes the topology from what they published, opens the authenticated control and data
connections, sets up shared memory, and starts the engine thread.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hora._engine.engine import Engine, EngineSettings
from hora._engine.negotiation import format_ranks
from hora._runtime.auth import Role
from hora._runtime.bootstrap import Bootstrap, local_addr_towards, start_bootstrap
from hora._runtime.connections import PeerListener, close_all, connect_peers
from hora._runtime.environment import LaunchInfo, detect
from hora._runtime.planes import (
    choose_transport,
    hierarchical_plane,
    kernel_id,
    left,
    shm_plane,
    store_barrier,
)
from hora._runtime.rendezvous import RendezvousClient, _MissingKeys
from hora._transport.base import DataPlane, SelfPlane
from hora._transport.liveness import process_start_time
from hora._transport.tcp import TcpPlane
from hora.config import Config
from hora.errors import ConfigError, NotInitializedError, RendezvousError

__all__ = [
    "Context",
    "cross_rank",
    "cross_size",
    "current",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]

log = logging.getLogger("hora")

_lock = threading.RLock()
_current: Context | None = None
_generation = 0
_atexit_registered = False


@dataclass
class Context:
    config: Config
    launch: LaunchInfo
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    transport: str
    engine: Engine
    peers: list[dict[str, Any]] = field(default_factory=list)
    bootstrap: Bootstrap | None = None
    _names: dict[str, int] = field(default_factory=dict)
    # what process sets need to connect their members later (see hora._process_sets)
    secret: bytes = b""
    bind_addr: str = "127.0.0.1"
    job_id: str = ""
    generation: int = 0
    sets: dict[int, Any] = field(default_factory=dict)  # process set id -> its SetContext (members only)
    set_ranks: dict[int, list[int]] = field(default_factory=dict)  # process set id -> its ranks (every rank)
    next_set_id: int = 1

    def auto_name(self, kind: str) -> str:
        """Deterministic names for unnamed collectives: the n-th unnamed allreduce is the same on every rank."""
        n = self._names.get(kind, 0)
        self._names[kind] = n + 1
        return f"{kind}.noname.{n}"


def _configure_logging(level: str) -> None:
    logger = logging.getLogger("hora")
    logger.setLevel(level)
    if not any(getattr(h, "_hora", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[hora %(asctime)s %(levelname)s] %(message)s"))
        handler._hora = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def init(**settings: Any) -> None:
    """Start hora in this process. Idempotent; ``init()`` after ``shutdown()`` starts a fresh group.

    Keyword arguments override settings of :class:`hora.config.Config` (e.g. ``transport="tcp"``).

    Raises:
        ConfigError: the launcher's variables or the settings are inconsistent.
        RendezvousError: the other ranks did not all arrive within ``start_timeout``.
    """
    global _current, _generation, _atexit_registered
    with _lock:
        if _current is not None:
            return
        config = Config.resolve(overrides=settings)
        _configure_logging(config.log_level)
        log.debug("settings: %s", config.public_dict())
        launch = detect()
        config = _drop_stale_hora_run_settings(config, launch)
        _generation += 1
        _current = _start(config, launch, _generation)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
        log.debug(
            "rank %d/%d initialised (%s, %s transport)",
            _current.rank,
            _current.size,
            launch.source,
            _current.transport,
        )


#: What ``hora run`` hands each of its workers about the job (as opposed to settings the user chose).
_HORA_RUN_JOB_SETTINGS = ("rendezvous_addr", "rendezvous_port", "secret", "secret_file", "job_id", "hostname")


def _drop_stale_hora_run_settings(config: Config, launch: LaunchInfo) -> Config:
    """Forget an outer ``hora run``'s job when another launcher started this process inside it.

    HORA_RANK next to another launcher's variables means hora run's worker started that launcher (see
    hora._runtime.environment), so the rendezvous address, secret, job id and host name it exported belong to the
    outer job, not to this one. Without HORA_RANK they were set by the user (e.g. for mpirun across hosts) and stay.
    """
    if launch.source in ("hora", "none") or not os.environ.get("HORA_RANK"):
        return config
    log.debug("ignoring the outer hora run's job settings: %s started this process", launch.source)
    defaults: dict[str, Any] = {
        f.name: f.default for f in dataclasses.fields(config) if f.name in _HORA_RUN_JOB_SETTINGS
    }
    return dataclasses.replace(config, **defaults)


def shutdown() -> None:
    """Stop the engine and release connections and shared memory. Pending collectives fail with ShutdownError."""
    global _current
    with _lock:
        ctx, _current = _current, None
    if ctx is None:
        return
    for sub in list(ctx.sets.values()):  # process sets first: their engines may wait on the global one's peers
        sub.engine.shutdown()
    ctx.sets.clear()
    ctx.engine.shutdown()
    if ctx.bootstrap is not None:
        ctx.bootstrap.close()


def is_initialized() -> bool:
    return _current is not None


def current() -> Context:
    ctx = _current
    if ctx is None:
        raise NotInitializedError("hora is not initialized: call hora.init() first (e.g. 'hvd.init()')")
    return ctx


# -- topology --------------------------------------------------------------------------------------------------------
def rank() -> int:
    """This process's rank, 0..size()-1."""
    return current().rank


def size() -> int:
    """The number of ranks."""
    return current().size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return current().local_rank


def local_size() -> int:
    """The number of ranks on this host."""
    return current().local_size


def cross_rank() -> int:
    """The index of this host among the hosts that have a rank with this local rank."""
    return current().cross_rank


def cross_size() -> int:
    """The number of hosts that have a rank with this process's local rank."""
    return current().cross_size


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    ctx = current()
    counts: dict[str, int] = {}
    for p in ctx.peers:
        counts[p["host"]] = counts.get(p["host"], 0) + 1
    return len(set(counts.values())) <= 1


# -- start-up -------------------------------------------------------------------------------------------------
def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("localhost", "::1")


def _start(config: Config, launch: LaunchInfo, generation: int) -> Context:
    hostname = config.hostname or socket.gethostname()
    if launch.size == 1 and not config.rendezvous_addr:
        engine = Engine(0, 1, SelfPlane(), {}, EngineSettings(config))
        engine.start()
        return Context(config, launch, 0, 1, 0, 1, 0, 1, hostname, "self", engine)

    deadline = time.monotonic() + config.start_timeout
    boot = start_bootstrap(config, launch, deadline)
    rank, size = launch.rank, launch.size
    prefix = f"{boot.job_id}/{config.attempt}/g{generation}/"
    cleanup: list[Any] = []
    try:
        store = RendezvousClient(
            boot.addr, boot.port, boot.secret, rank, prefix, deadline, config.max_frame_bytes
        )
        cleanup.append(store)
        bind = config.bind_addr or ("127.0.0.1" if _is_loopback(boot.addr) else local_addr_towards(boot.addr))
        listener = PeerListener(bind, boot.secret, config.port_range)
        cleanup.append(listener)
        me = {
            "host": hostname,
            "pid": os.getpid(),
            "start": process_start_time(os.getpid()),
            "addr": listener.address[0],
            "port": listener.address[1],
            "hint": [launch.local_rank, launch.local_size],
            "kernel": kernel_id(),
            "engine": [config.fusion_threshold, config.cache_capacity],
        }
        store.set(f"rank/{rank}", json.dumps(me))
        try:
            raw = store.wait([f"rank/{r}" for r in range(size)], left(deadline))
        except _MissingKeys as exc:
            missing = [int(k.split("/")[1]) for k in exc.missing]
            raise RendezvousError(
                f"rank {rank}: {format_ranks(missing)} never arrived at the rendezvous within {config.start_timeout:g}s "
                f"({launch.source} launched {size} ranks). Check that every rank was started and calls hora.init(); "
                "raise HORA_START_TIMEOUT (hora run --start-timeout) if start-up is just slow."
            ) from None
        peers = [json.loads(raw[f"rank/{r}"]) for r in range(size)]
        _check_engine_settings(peers)
        topo = _topology(peers, rank, launch.source)
        transport = choose_transport(config, topo["hosts"], size)

        expected: set[tuple[Role, int]] = set()
        if rank == 0:
            expected |= {(Role.CONTROL, r) for r in range(1, size)}
        mesh = transport in ("tcp", "hierarchical")  # the flat ring over every rank; lanes share its sockets
        if mesh:
            expected |= {(Role.DATA, r) for r in range(rank + 1, size)}
        listener.start_accepting(expected, deadline)
        dialed_control = connect_peers(
            [(0, peers[0]["addr"], peers[0]["port"])] if rank else [],
            Role.CONTROL,
            rank,
            boot.secret,
            deadline,
        )
        cleanup.extend(dialed_control.values())
        dialed_data = connect_peers(
            [(r, peers[r]["addr"], peers[r]["port"]) for r in range(rank)] if mesh else [],
            Role.DATA,
            rank,
            boot.secret,
            deadline,
        )
        cleanup.extend(dialed_data.values())
        accepted = listener.wait()
        cleanup.extend(accepted.values())
        control = dialed_control or {r: s for (role, r), s in accepted.items() if role is Role.CONTROL}

        plane: DataPlane
        if size == 1:
            plane = SelfPlane()
        elif mesh:
            data = {**dialed_data, **{r: s for (role, r), s in accepted.items() if role is Role.DATA}}
            labels = {r: f"rank {r} (host {p['host']})" for r, p in enumerate(peers)}
            flat = TcpPlane(rank, size, data, config.tcp_chunk_bytes, config.op_timeout, labels)
            if transport == "tcp":
                plane = flat
            else:
                cleanup.append(flat)
                plane = hierarchical_plane(config, store, boot, peers, topo, rank, flat, data, generation, deadline)
                cleanup.remove(flat)
        else:
            plane = shm_plane(config, store, boot, peers, rank, size, generation, deadline)
        cleanup.append(plane)

        # Everyone is connected: the bootstrap file (if any) has served its purpose.
        store_barrier(store, "ready", size, deadline, rank)
        boot.unpublish()
        store.close()
        listener.close()
        describe = {r: f"rank {r} (host {p['host']}, pid {p['pid']})" for r, p in enumerate(peers)}
        engine = Engine(rank, size, plane, control, EngineSettings(config), describe)
        engine.start()
    except BaseException:
        close_all(cleanup)
        boot.close()
        raise
    return Context(
        config,
        launch,
        rank,
        size,
        topo["local_rank"],
        topo["local_size"],
        topo["cross_rank"],
        topo["cross_size"],
        hostname,
        transport,
        engine,
        peers,
        boot if boot.server else None,
        secret=boot.secret,
        bind_addr=bind,
        job_id=boot.job_id,
        generation=generation,
    )


def _topology(peers: list[dict[str, Any]], rank: int, source: str) -> dict[str, Any]:
    hosts: list[str] = []
    for p in peers:
        if p["host"] not in hosts:
            hosts.append(p["host"])
    local = {h: [r for r, p in enumerate(peers) if p["host"] == h] for h in hosts}
    problems = []
    for r, p in enumerate(peers):
        lr, ls = local[p["host"]].index(r), len(local[p["host"]])
        hint = p.get("hint") or [None, None]
        if (hint[0] is not None and hint[0] != lr) or (hint[1] is not None and hint[1] != ls):
            problems.append(
                f"rank {r} on {p['host']}: launcher says local rank {hint[0]} of {hint[1]}, "
                f"hosts at the rendezvous give {lr} of {ls}"
            )
    if problems:
        raise ConfigError(
            f"the {source} launcher's local ranks disagree with the hosts the ranks reported:\n  "
            + "\n  ".join(problems)
            + "\nEvery rank on one machine must report the same host name: check HORA_HOSTNAME / the launcher's host list."
        )
    my_host = peers[rank]["host"]
    local_rank, local_size = local[my_host].index(rank), len(local[my_host])
    cross = [h for h in hosts if len(local[h]) > local_rank]
    return {
        "hosts": hosts,
        "local": [local[h] for h in hosts],
        "local_rank": local_rank,
        "local_size": local_size,
        "cross_rank": cross.index(my_host),
        "cross_size": len(cross),
    }


def _check_engine_settings(peers: list[dict[str, Any]]) -> None:
    """Every rank must fuse and cache alike: they compute the same groups and exchange vectors of one length."""
    for i, (label, names) in enumerate(
        [
            ("fusion threshold", "HORA_FUSION_THRESHOLD / HOROVOD_FUSION_THRESHOLD"),
            ("cache capacity", "HORA_CACHE_CAPACITY / HOROVOD_CACHE_CAPACITY"),
        ]
    ):
        groups: dict[int, list[int]] = {}
        for r, p in enumerate(peers):
            groups.setdefault(int(p["engine"][i]), []).append(r)
        if len(groups) > 1:
            parts = [f"{v} on {format_ranks(rs)}" for v, rs in groups.items()]
            raise ConfigError(
                f"the ranks disagree on the {label}: {' but '.join(parts)}; set {names} alike for every rank"
            )
