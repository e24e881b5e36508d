"""Ranks that a cluster engine starts (Ray actors, Spark barrier tasks): placing them on the hosts the engine chose,
the environment each rank gets, the job's rendezvous, and running the user's function as one rank.

``hora run`` execs its ranks and hands each its environment at start. Ray and Spark start the worker processes
themselves and only run Python code that hora gives them, so here the code writes the worker environment
(:func:`hora.config.worker_env.worker_env`, the same contract as ``hora run``'s) into its own process and then
calls the function: ``hora.init()`` inside it finds its rank, the rendezvous and the secret exactly as under
``hora run``. The secret travels with the engine's own task arguments, never on a command line or in a log.
"""

from __future__ import annotations

import socket
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hora
from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousServer
from hora.config.launchers import LAUNCHER_VARIABLES
from hora.config.process_env import restore_process_env, set_process_env
from hora.config.worker_env import worker_env
from hora.errors import ConfigError
from hora.runner.hosts import RankSlot

__all__ = ["JobRendezvous", "free_port", "place", "rank_env", "run_as_rank", "traceback_text"]


def place(hosts: Sequence[str]) -> list[RankSlot]:
    """Each rank's place given the host of every rank (in rank order), as hora's topology computes it.

    Local ranks follow rank order within a host; hosts are ordered by their first rank; cross rank/size count the
    hosts that have a rank with the same local rank.
    """
    order = list(dict.fromkeys(hosts))
    members = {h: [r for r, x in enumerate(hosts) if x == h] for h in order}
    out = []
    for rank, host in enumerate(hosts):
        local_rank = members[host].index(rank)
        cross = [h for h in order if len(members[h]) > local_rank]
        out.append(RankSlot(rank, host, local_rank, len(members[host]), cross.index(host), len(cross)))
    return out


def free_port(host: str = "") -> int:
    """A port free on this machine now (for torch.distributed's ``MASTER_PORT``, which hora itself does not use)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class JobRendezvous:
    """The rendezvous store of one job, with the job's secret and id, hosted in this process (a thread).

    ``host`` is the address it listens on: 127.0.0.1 when every rank runs on this machine, else an address of this
    machine the ranks reach.
    """

    host: str = "127.0.0.1"
    secret: bytes = field(default_factory=new_secret, repr=False)
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    server: RendezvousServer | None = field(default=None, repr=False)

    def start(self) -> tuple[str, int]:
        """Listen and serve; return (address, port).

        Raises:
            ConfigError: nothing can listen on ``host``.
        """
        self.server = RendezvousServer(self.secret, host=self.host)
        try:
            return self.server.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.host} for the rendezvous: {exc.strerror}") from None

    @property
    def address(self) -> tuple[str, int]:
        if self.server is None:
            raise ConfigError("the rendezvous is not started")
        return self.server.address

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None


def rank_env(
    slot: RankSlot,
    size: int,
    rendezvous: tuple[str, int],
    secret: bytes,
    job_id: str,
    master: tuple[str, int],
    bind_addr: str | None = None,
    extra: Mapping[str, str] | None = None,
    settings: Mapping[str, Any] | None = None,
    cpus: int | None = None,
) -> dict[str, str]:
    """The variables rank ``slot.rank`` writes into its process: ``hora run``'s worker contract plus ``extra``
    (``cpus``: its host's cores, for the thread defaults)."""
    return worker_env(
        dict(extra or {}),
        rank=slot.rank,
        size=size,
        local_rank=slot.local_rank,
        local_size=slot.local_size,
        cross_rank=slot.cross_rank,
        cross_size=slot.cross_size,
        host=slot.host,
        rendezvous=rendezvous,
        secret=secret,
        job_id=job_id,
        master_addr=master[0],
        master_port=master[1],
        bind_addr=bind_addr,
        settings=settings,
        cpus=cpus,
    )


def run_as_rank(
    env: Mapping[str, str],
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    keep: bool = False,
) -> Any:
    """Call ``fn(*args, **kwargs)`` in this process as the rank ``env`` describes; return its result.

    Other launchers' per-process variables are removed first (they would win over hora's, docs/launchers.md). With
    ``keep`` the environment and an initialised hora stay for later calls (a Ray actor is one rank for the
    executor's life); otherwise hora is shut down and the environment restored afterwards (a Spark Python worker is
    reused by later tasks).
    """
    previous = set_process_env(env, remove=[v for v in LAUNCHER_VARIABLES if v not in env])
    try:
        return fn(*args, **dict(kwargs or {}))
    finally:
        if not keep:
            hora.shutdown()
            restore_process_env(previous)


def traceback_text(exc: BaseException) -> str:
    """The formatted traceback of ``exc`` (what a driver shows for a failed rank), from the user's function on:
    the frames of the engine and of :func:`run_as_rank` that called it are left out."""
    tb = exc.__traceback__
    walk = tb
    while walk is not None:
        if walk.tb_frame.f_code is run_as_rank.__code__:
            tb = walk.tb_next or tb
            break
        walk = walk.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))
