"""The worker environment contract: every variable a launcher (``hora run``, ``hora job``) writes for its workers
and the runtime reads back, in one table (:data:`WORKER_VARIABLES`), with its writer (:func:`worker_env`); the
reader is :func:`hora.config.launchers.detect` (rank, size, local rank and size) and :class:`~hora.config.Config`
(the rest). docs/launchers.md shows the same table; a test checks them against
each other and against what :func:`worker_env` really writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hora.config.settings import Config

__all__ = ["TOPOLOGY", "WORKER_VARIABLES", "WorkerVariable", "worker_env"]

#: The topology variables, each written as ``HORA_<X>`` and Horovod's ``HOROVOD_<X>``.
TOPOLOGY = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")


@dataclass(frozen=True)
class WorkerVariable:
    """Variables of the contract that go together, what they mean and an example of each."""

    names: tuple[str, ...]
    meaning: str
    example: str


WORKER_VARIABLES: tuple[WorkerVariable, ...] = (
    WorkerVariable(("HORA_RANK", "HORA_SIZE"), "rank of this process, number of ranks", "`5`, `8`"),
    WorkerVariable(("HORA_LOCAL_RANK", "HORA_LOCAL_SIZE"), "rank among the ranks of this host, their number", "`5`, `8`"),
    WorkerVariable(("HORA_CROSS_RANK", "HORA_CROSS_SIZE"), "index of this host among the hosts, their number", "`0`, `1`"),
    WorkerVariable(
        ("HORA_HOSTNAME",),
        "the host name the launcher uses for this rank; ranks with the same name share memory",
        "`localhost`",
    ),
    WorkerVariable(
        ("HORA_RENDEZVOUS_ADDR", "HORA_RENDEZVOUS_PORT"),
        "where the launcher's rendezvous store listens (127.0.0.1; with remote hosts, an address they reach)",
        "`127.0.0.1`, `41873`",
    ),
    WorkerVariable(
        ("HORA_BIND_ADDR",),
        "only with several hosts: the address this rank's listener binds and advertises (see "
        "[multihost.md](multihost.md#choosing-the-network))",
        "`10.0.0.7`",
    ),
    WorkerVariable(
        ("HORA_SECRET",),
        "the per-job secret, 32 random bytes in hex, drawn fresh for every job. Only in the environment (readable "
        "by the worker's user through `/proc/<pid>/environ`, like any environment), never on a command line, so "
        "`ps` does not show it; every connection proves it knows it (HMAC challenge-response) before anything is "
        "parsed.",
        "`9f2c…` (64 hex digits)",
    ),
    WorkerVariable(
        ("HORA_JOB_ID",),
        "the job's id; rendezvous keys and shared-memory names are namespaced by it",
        "`3fa85f6457174562`",
    ),
    WorkerVariable(("RANK", "WORLD_SIZE"), "torchrun's names for `HORA_RANK`, `HORA_SIZE`", "`5`, `8`"),
    WorkerVariable(
        ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), "torchrun's names for `HORA_LOCAL_RANK`, `HORA_LOCAL_SIZE`", "`5`, `8`"
    ),
    WorkerVariable(
        ("MASTER_ADDR", "MASTER_PORT"),
        'a free port for `torch.distributed.init_process_group("env://")` (hora itself does not use them)',
        "`127.0.0.1`, `45211`",
    ),
    WorkerVariable(
        (
            "HOROVOD_RANK",
            "HOROVOD_SIZE",
            "HOROVOD_LOCAL_RANK",
            "HOROVOD_LOCAL_SIZE",
            "HOROVOD_CROSS_RANK",
            "HOROVOD_CROSS_SIZE",
            "HOROVOD_HOSTNAME",
        ),
        "Horovod's names for the same values, for code that reads them",
        "`5`, `8`, …",
    ),
    WorkerVariable(("PYTHONUNBUFFERED",), "`1`, so prints appear as they happen", "`1`"),
)


def worker_env(
    base: Mapping[str, str],
    *,
    rank: int,
    size: int,
    local_rank: int,
    local_size: int,
    cross_rank: int,
    cross_size: int,
    host: str,
    rendezvous: tuple[str, int],
    secret: bytes,
    job_id: str,
    master_addr: str,
    master_port: int,
    bind_addr: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """``base`` plus everything a worker gets: hora's variables, torchrun's names and Horovod's, and ``settings``
    (explicit :class:`Config` settings, exported as their ``HORA_*`` variables so they beat inherited ones)."""
    env = dict(base)
    topo = {
        "RANK": rank,
        "SIZE": size,
        "LOCAL_RANK": local_rank,
        "LOCAL_SIZE": local_size,
        "CROSS_RANK": cross_rank,
        "CROSS_SIZE": cross_size,
    }
    for k, v in topo.items():
        env[f"HORA_{k}"] = env[f"HOROVOD_{k}"] = str(v)
    env["HORA_HOSTNAME"] = env["HOROVOD_HOSTNAME"] = host
    if bind_addr:
        env["HORA_BIND_ADDR"] = bind_addr
    env.update(
        HORA_RENDEZVOUS_ADDR=rendezvous[0],
        HORA_RENDEZVOUS_PORT=str(rendezvous[1]),
        HORA_SECRET=secret.hex(),
        HORA_JOB_ID=job_id,
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        PYTHONUNBUFFERED="1",
    )
    env.update(Config.env_for(settings or {}))
    return env

