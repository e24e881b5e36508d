"""The per-process hora context: ``init()`` / ``shutdown()`` and the topology queries.

``init()`` resolves the settings, finds out which launcher started the process, finds the rendezvous store and the
job secret (:mod:`.bootstrap`), and assembles the global group of every rank (:mod:`.group`): the ranks publish
themselves at the store, connect, build their transport and start the engine thread.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hora._engine import outputs
from hora._engine.engine import Engine
from hora._engine.negotiation import format_ranks
from hora._runtime import excepthook
from hora._runtime.bootstrap import Bootstrap, local_addr_towards, runtime_dir, start_bootstrap
from hora._runtime.connections import close_all
from hora._runtime.elastic_join import Membership, NoticeListener, RoundWatch, join, leave_on_sigterm
from hora._runtime.group import Group, GroupSpec, assemble
from hora._runtime.peers import Peer, StoreDirectory
from hora._runtime.rendezvous import RendezvousClient
from hora._runtime.stacks import register_stack_dump
from hora.config import Config, launchers
from hora.config.launchers import LaunchInfo, detect
from hora.config.variables import read
from hora.errors import HoraError, NotInitializedError

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
    "max_size",
    "rank",
    "shutdown",
    "size",
]

log = logging.getLogger("hora")

_lock = threading.RLock()
_current: Context | None = None
#: inits so far per job (HORA_JOB_ID or the launcher's job key): the rendezvous keys of the n-th init of a job
#: carry g<n>. Counted per job, not per process, because one process can be a rank of several jobs in turn (a Spark
#: Python worker reused by the tasks of later stages) and every rank of a job must count the same.
_generations: dict[str, int] = {}
_atexit_registered = False


@dataclass
class Context:
    """This process's hora: the global group and its process sets, and what later groups need to connect."""

    config: Config
    launch: LaunchInfo
    hostname: str
    group: Group  # every rank
    bootstrap: Bootstrap | None = None  # the store rank 0 hosts itself (outside hora run)
    secret: bytes = b""
    bind_addr: str = "127.0.0.1"
    job_id: str = ""
    tag: str = "g0"  # this init's name among the job's groups: g<n>, or e<round> in an elastic job
    sets: dict[int, Group] = field(default_factory=dict)  # process set id -> its group (members only)
    set_ranks: dict[int, list[int]] = field(default_factory=dict)  # process set id -> its ranks (every rank)
    next_set_id: int = 1
    notices: NoticeListener | None = None  # rank 0 of an elastic job: host-update notices from the launcher

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def engine(self) -> Engine:
        return self.group.engine

    @property
    def peers(self) -> tuple[Peer, ...]:
        return self.group.peers

    @property
    def transport(self) -> str:
        return self.group.transport


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
    global _current, _atexit_registered
    with _lock:
        if _current is not None:
            return
        config = Config.resolve(overrides=settings)
        _configure_logging(config.log_level)
        log.debug("settings: %s", config.public_dict())
        launch = detect()
        config = _drop_stale_hora_run_settings(config, launch)
        register_stack_dump()  # under hora run: where this rank is, should hora run have to stop it
        job = config.job_id or launch.job_key
        _generations[job] = _generations.get(job, 0) + 1
        _current = _start(config, launch, _generations[job])
        try:  # an uncaught error through hora shows the script's frames; the full one is kept here
            keep: Path | None = runtime_dir(config)
        except HoraError:
            keep = None  # no private directory: the short form names no file
        excepthook.install(keep, f"rank {_current.rank} of {_current.size}, job {job}")
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
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
    hora.config.launchers), so the rendezvous address, secret, job id and host name it exported belong to the
    outer job, not to this one. Without HORA_RANK they were set by the user (e.g. for mpirun across hosts) and stay.
    """
    if not launch.inside_hora_run:
        return config
    log.debug("ignoring the outer hora run's job settings: %s started this process", launch.source)
    defaults: dict[str, Any] = {
        f.name: f.default for f in dataclasses.fields(config) if f.name in _HORA_RUN_JOB_SETTINGS
    }
    return dataclasses.replace(config, **defaults)


def _shutdown_at_exit() -> None:
    """The interpreter is exiting with hora still up: tell the other ranks whether the script ended or raised."""
    _shutdown("error" if getattr(sys, "last_value", None) is not None else "exit")


def shutdown() -> None:
    """Stop the engine and release connections and shared memory. Pending collectives fail with ShutdownError."""
    _shutdown("")


def _shutdown(exiting: str) -> None:
    global _current
    with _lock:
        ctx, _current = _current, None
    if ctx is None:
        return
    for sub in list(ctx.sets.values()):  # process sets first: their engines may wait on the global one's peers
        sub.engine.shutdown(exiting=exiting)
    ctx.sets.clear()
    ctx.engine.shutdown(exiting=exiting)
    if ctx.notices is not None:
        ctx.notices.close()
    if ctx.bootstrap is not None:
        ctx.bootstrap.close()
    outputs.clear()  # the result buffers kept for reuse


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


def max_size() -> int:
    """The most ranks the job can have: ``--max-np`` of an elastic job, else :func:`size` (Horovod documents
    ``hvd.max_size()`` without defining it). Keep the number of data partitions at this to repartition nothing
    when ranks come and go."""
    ctx = current()
    limit = read("HORA_ELASTIC_MAX_NP") if launchers.elastic() else None
    return int(limit) if limit else ctx.size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return current().group.topology.local_rank


def local_size() -> int:
    """The number of ranks on this host."""
    return current().group.topology.local_size


def cross_rank() -> int:
    """The index of this host among the hosts that have a rank with this local rank."""
    return current().group.topology.cross_rank


def cross_size() -> int:
    """The number of hosts that have a rank with this process's local rank."""
    return current().group.topology.cross_size


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return len({len(members) for members in current().group.topology.local}) <= 1


# -- start-up -------------------------------------------------------------------------------------------------
def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("localhost", "::1")


def _start(config: Config, launch: LaunchInfo, generation: int) -> Context:
    hostname = config.hostname or socket.gethostname()
    if launch.size == 1 and not config.rendezvous_addr:
        spec = GroupSpec(config, (0,), f"{config.attempt}-g{generation}", b"", "", launch.source)
        group = assemble(spec, _NoDirectory(), 0, hostname=hostname, bind_addr="127.0.0.1", deadline=0.0)
        assert group is not None
        return Context(config, launch, hostname, group, tag=f"g{generation}")

    deadline = time.monotonic() + config.start_timeout
    boot = start_bootstrap(config, launch, deadline)
    rank, size, hint, tag = launch.rank, launch.size, (launch.local_rank, launch.local_size), f"g{generation}"
    member: Membership | None = None
    if launchers.elastic():  # the elastic launcher says which round, rank and size this init is
        member = join(config, boot)
        leave_on_sigterm(config, boot)
        rank, size, hint, tag = member.rank, member.size, (member.local_rank, member.local_size), f"e{member.round}"
        deadline = time.monotonic() + config.start_timeout
    cleanup: list[Any] = []
    try:
        watch = RoundWatch(config, boot, member.round) if member is not None else None
        if watch is not None:
            cleanup.append(watch)
        store = RendezvousClient(
            boot.addr,
            boot.port,
            boot.secret,
            rank,
            f"{boot.job_id}/{config.attempt}/{tag}/",
            deadline,
            config.max_frame_bytes,
        )
        cleanup.append(store)
        bind = config.bind_addr or ("127.0.0.1" if _is_loopback(boot.addr) else local_addr_towards(boot.addr))

        def missing(ranks: list[int]) -> str:
            return (
                f"rank {rank}: {format_ranks(ranks)} never arrived at the rendezvous within {config.start_timeout:g}s "
                f"({launch.source} launched {size} ranks). Check that every rank was started and calls hora.init(); "
                "raise HORA_START_TIMEOUT (hora run --start-timeout) if start-up is just slow."
            )

        spec = GroupSpec(
            config, tuple(range(size)), f"{config.attempt}-{tag}", boot.secret, boot.job_id, launch.source
        )
        group = assemble(
            spec,
            StoreDirectory(store, rank, size, deadline, missing, watch.failed if watch is not None else None),
            rank,
            hostname=hostname,
            bind_addr=bind,
            deadline=deadline,
            local_hint=hint,
        )
        assert group is not None
        # Everyone is connected: the bootstrap file (if any) has served its purpose.
        boot.unpublish()
        close_all(cleanup)
        notices = NoticeListener(config, boot, member.notices) if member is not None and rank == 0 else None
    except BaseException:
        close_all(cleanup)
        boot.close()
        raise
    return Context(
        config,
        launch,
        hostname,
        group,
        boot if boot.server else None,
        secret=boot.secret,
        bind_addr=bind,
        job_id=boot.job_id,
        tag=tag,
        notices=notices,
    )


class _NoDirectory:
    """A one-rank group exchanges nothing."""

    def allgather(self, key: str, value: dict[str, Any] | None) -> list[dict[str, Any]]:
        raise AssertionError("a one-rank group has no one to exchange with")  # pragma: no cover

    def barrier(self, key: str) -> None:
        raise AssertionError("a one-rank group has no one to wait for")  # pragma: no cover
