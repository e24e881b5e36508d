"""The worker environment contract: every variable a launcher (``hora run``, ``hora job``) writes for its workers
and the runtime reads back, in one table (:data:`WORKER_VARIABLES`), with its writer (:func:`worker_env`); the
reader is :func:`hora.config.launchers.detect` (rank, size, local rank and size) and :class:`~hora.config.Config`
(the rest). docs/launchers.md shows the same table; a test checks them against
each other and against what :func:`worker_env` really writes.

``hora job`` adds SageMaker's names for a job's scripts (:data:`JOB_VARIABLES`, docs/jobs.md), written by the same
:func:`worker_env` when it is given a :class:`JobExtras`: its rank wrapper (:mod:`hora.jobs._entry`) rewrites the
variables hora run gave it with its host's own addresses, reading back what hora run drew for the whole job
(:class:`JobKeys`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from hora.config.parsers import parse_bool
from hora.config.settings import Config
from hora.errors import ConfigError

__all__ = [
    "JOB_VARIABLES",
    "TOPOLOGY",
    "WORKER_VARIABLES",
    "JobExtras",
    "JobKeys",
    "WorkerVariable",
    "thread_defaults",
    "topology_env",
    "worker_env",
]

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
    WorkerVariable(
        ("HORA_LOCAL_RANK", "HORA_LOCAL_SIZE"), "rank among the ranks of this host, their number", "`5`, `8`"
    ),
    WorkerVariable(
        ("HORA_CROSS_RANK", "HORA_CROSS_SIZE"), "index of this host among the hosts, their number", "`0`, `1`"
    ),
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
        ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        "torchrun's names for `HORA_LOCAL_RANK`, `HORA_LOCAL_SIZE`",
        "`5`, `8`",
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
    WorkerVariable(
        ("OMP_NUM_THREADS", "MKL_NUM_THREADS"),
        "the rank's share of its host's cores (cores // ranks on the host, at least 1), only where the user has "
        "not set them and `HORA_THREAD_DEFAULTS` is not 0 (`--no-thread-defaults`): intra-op thread pools (torch, "
        "numpy's BLAS, TensorFlow) then do not oversubscribe the host",
        "`4`",
    ),
)


@dataclass(frozen=True)
class JobExtras:
    """What ``hora job`` gives the scripts of one host beyond the contract (:data:`JOB_VARIABLES`): the job's name,
    the host's tree (its ``/opt/ml``), and ``exports``, the spec's ``custom_mpi_options`` ``-x NAME=VALUE`` (written
    last, as mpirun exports them, so they win over everything else)."""

    job_name: str
    base_dir: str
    exports: Mapping[str, str] = field(default_factory=dict)


#: hora job's additions to the contract for a job's scripts (SageMaker's names; docs/jobs.md lists them).
JOB_VARIABLES: tuple[WorkerVariable, ...] = (
    WorkerVariable(("GROUP_RANK",), "torchrun's name for `HORA_CROSS_RANK`: the index of this rank's host", "`1`"),
    WorkerVariable(
        ("HORA_JOB_NAME", "TRAINING_JOB_NAME"),
        "the job's name; `TRAINING_JOB_NAME` is what SageMaker's platform sets (the training toolkit's "
        "`Environment().job_name`)",
        "`my-job`",
    ),
    WorkerVariable(
        ("SAGEMAKER_BASE_DIR",),
        "the host's tree, where SageMaker's training toolkit reads the host's config, so its `Environment()` agrees "
        "with the `SM_*` variables",
        "`/opt/ml`",
    ),
)


@dataclass(frozen=True)
class JobKeys:
    """What a launcher drew for the whole job and gave every worker: the rendezvous store's address, the secret,
    the job id and torch.distributed's master port."""

    rendezvous: tuple[str, int]
    secret: bytes
    job_id: str
    master_port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobKeys:
        """The keys :func:`worker_env` wrote into ``env``.

        Raises:
            ConfigError: a variable is missing or invalid (``env`` is not a worker's of hora run).
        """

        def get(name: str) -> str:
            value = env.get(name, "")
            if not value:
                raise ConfigError(
                    f"{name} is not set: this process is not a worker that hora run started (hora run sets "
                    f"{', '.join(_KEY_NAMES)} for every worker); start it with hora run"
                )
            return value

        def parsed(name: str, parse: Callable[[str], Any], what: str) -> Any:
            text = get(name)
            try:
                return parse(text)
            except ValueError:
                raise ConfigError(f"{name}={text!r} is not {what}, as hora run writes it") from None

        return cls(
            (get("HORA_RENDEZVOUS_ADDR"), parsed("HORA_RENDEZVOUS_PORT", int, "a port number")),
            parsed("HORA_SECRET", bytes.fromhex, "hex"),
            get("HORA_JOB_ID"),
            parsed("MASTER_PORT", int, "a port number"),
        )


_KEY_NAMES = ("HORA_RENDEZVOUS_ADDR", "HORA_RENDEZVOUS_PORT", "HORA_SECRET", "HORA_JOB_ID", "MASTER_PORT")


def topology_env(
    env: MutableMapping[str, str] | None,
    rank: int,
    size: int,
    local_rank: int,
    local_size: int,
    cross_rank: int,
    cross_size: int,
) -> None:
    """Write the topology variables of the contract into ``env``: hora's, Horovod's and torchrun's names (also
    this process's environment, ``env=None``, for an elastic rank after a reset, as Horovod's reset updates it)."""
    if env is None:
        env = os.environ
    for name, value in zip(TOPOLOGY, (rank, size, local_rank, local_size, cross_rank, cross_size)):
        env[f"HORA_{name}"] = env[f"HOROVOD_{name}"] = str(value)
    env["RANK"], env["WORLD_SIZE"] = str(rank), str(size)
    env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"] = str(local_rank), str(local_size)


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
    cpus: int | None = None,
    job: JobExtras | None = None,
) -> dict[str, str]:
    """``base`` plus everything a worker gets: hora's variables, torchrun's names and Horovod's, and ``settings``
    (explicit :class:`Config` settings, exported as their ``HORA_*`` variables so they beat inherited ones); with
    ``cpus`` (the host's cores), the thread defaults (:func:`thread_defaults`); with ``job``, hora job's variables
    (:data:`JOB_VARIABLES`) and, last, its exports."""
    env = dict(base)
    topology_env(env, rank, size, local_rank, local_size, cross_rank, cross_size)
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
    if cpus is not None:
        thread_defaults(env, local_size, cpus)
    if job is not None:
        env.update(
            GROUP_RANK=str(cross_rank),
            HORA_JOB_NAME=job.job_name,
            TRAINING_JOB_NAME=job.job_name,
            SAGEMAKER_BASE_DIR=job.base_dir,
        )
        env.update(job.exports)
    return env


def thread_defaults(env: dict[str, str], local_size: int, cpus: int) -> None:
    """Set OMP_NUM_THREADS and MKL_NUM_THREADS in ``env`` to this rank's share of ``cpus`` cores, each only where
    ``env`` has no value for it, unless ``env``'s HORA_THREAD_DEFAULTS turns the defaults off."""
    if not parse_bool(env.get("HORA_THREAD_DEFAULTS", "1")):
        return
    share = str(max(1, cpus // max(1, local_size)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, share)

