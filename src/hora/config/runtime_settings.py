"""The settings of how a rank starts, waits and moves bytes: the start-up and operation time-outs, the thread
defaults a launcher gives each rank, and the data plane (transport, hierarchical collectives, chunk and frame sizes).
One group of :class:`hora.config.Config` (:mod:`hora.config.settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from hora.config import parsers
from hora.config.fields import Flag, setting

__all__ = ["RuntimeSettings"]


@dataclass(frozen=True)
class RuntimeSettings:
    """How a rank starts, waits and moves bytes."""

    start_timeout: float = setting(
        30.0,
        parsers.positive_float,
        "HORA_START_TIMEOUT",
        "HOROVOD_START_TIMEOUT",
        help="Seconds every rank may take to reach the rendezvous before start-up fails naming the missing ranks.",
        flag=Flag(
            "--start-timeout",
            "seconds every rank may take to reach the rendezvous",
            metavar="SECONDS",
            group="run",
        ),
    )
    elastic_timeout: float = setting(
        600.0,
        parsers.positive_float,
        "HORA_ELASTIC_TIMEOUT",
        "HOROVOD_ELASTIC_TIMEOUT",
        help="Elastic jobs: seconds the launcher waits for --min-np slots to be available, and a rank waits for "
        "the launcher to form the next set of ranks after a reset, before the job fails.",
        flag=Flag(
            "--elastic-timeout",
            "elastic jobs: seconds to wait for --min-np slots (and for the next set of ranks after a reset)",
            metavar="SECONDS",
            group="run",
        ),
    )
    grace_period: float = setting(
        30.0,
        parsers.positive_float,
        "HORA_GRACE_PERIOD",
        help="Seconds hora run gives a rank between SIGTERM and SIGKILL when it stops the job (Ctrl-C, a failed rank, "
        "its own SIGTERM), so a script that catches SIGTERM can checkpoint. In an elastic job a rank sent SIGTERM (a "
        "preemption) leaves at its next commit(); past this it is killed.",
        flag=Flag(
            "--grace-period",
            "seconds between SIGTERM and SIGKILL when ranks are stopped (and for an elastic rank to leave)",
            metavar="SECONDS",
            group="run",
        ),
    )
    oversubscribe: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_OVERSUBSCRIBE",
        help="Let hora run and hora job start more than 16 processes per usable CPU on one machine (ranks and "
        "parameter servers together); without it such counts are refused before anything starts.",
        flag=Flag(
            "--oversubscribe",
            "allow more than 16 processes (ranks and servers) per CPU on one machine",
            action="store_true",
            group="run",
        ),
    )
    merge_stderr: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_MERGE_STDERR",
        help="Give each rank (and parameter server) one pipe for stdout and stderr, as mpirun's "
        "--merge-stderr-to-stdout does: everything it writes keeps its order and shows as <stdout>. By default "
        "the two streams are separate pipes, so lines written to both within the same instant may swap.",
        flag=Flag(
            "--merge-stderr-to-stdout",
            "send each rank's stderr into its stdout, keeping the order of everything it writes (mpirun's flag)",
            action="store_true",
            group="run",
        ),
    )
    record: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_RECORD",
        help="Keep this hora run in the job store (HORA_JOB_HOME, default ~/.hora) as a run entry: its command, "
        "hosts and ranks, every rank's output and, on failure, the root-cause report, so hora dashboard and hora "
        "job list/describe/logs/stop show it while it runs and after.",
        flag=Flag(
            "--record",
            "keep this run in the job store, for hora dashboard and hora job list/logs",
            action="store_true",
            group="run",
        ),
    )
    op_timeout: float = setting(
        300.0,
        parsers.positive_float,
        "HORA_OP_TIMEOUT_SECONDS",
        "HOROVOD_GLOO_TIMEOUT_SECONDS",
        help="Seconds a rank waits without progress (no bytes from or to a peer) inside an already negotiated "
        "collective before raising; a slow transfer that keeps moving never times out. In negotiation a worker waits "
        "up to twice that for rank 0's reply, so that rank 0 (which waits this long for each rank) names a stuck rank "
        "to all.",
    )
    thread_defaults: bool = setting(
        True,
        parsers.parse_bool,
        "HORA_THREAD_DEFAULTS",
        help=(
            "Launchers (hora run, hora job) give each rank OMP_NUM_THREADS and MKL_NUM_THREADS = its share of its "
            "host's cores (at least 1) where the user has not set them, so ranks' intra-op thread pools do not "
            "oversubscribe the machine (torchrun sets 1). 0 leaves them unset."
        ),
        flag=Flag(
            "--thread-defaults",
            "give each rank OMP/MKL_NUM_THREADS = its share of the host's cores unless set, or (--no-...) leave "
            "them unset",
            group="run",
            action="boolean_optional",
        ),
    )
    transport: str = setting(
        "auto",
        parsers.choice("auto", "shm", "tcp"),
        "HORA_TRANSPORT",
        help="Data plane: 'shm' (shared memory, one host only), 'tcp', or 'auto' (shm when all ranks share a host; "
        "across hosts, TCP with shared memory within each host as the HORA_HIERARCHICAL_* settings say).",
        flag=Flag("--transport", "data plane between ranks", group="run", choices=("auto", "shm", "tcp")),
    )
    hierarchical_allreduce: bool = setting(
        True,
        parsers.parse_bool,
        "HORA_HIERARCHICAL_ALLREDUCE",
        "HOROVOD_HIERARCHICAL_ALLREDUCE",
        help=(
            "On jobs spanning several hosts: allreduce as a shared-memory reduce-scatter within each host, TCP "
            "rings across hosts (each local rank carrying a slice), and a shared-memory allgather (1), or one "
            "flat TCP ring over every rank (0). No effect on one host or with HORA_TRANSPORT=tcp."
        ),
        flag=Flag(
            "--hierarchical-allreduce",
            "on multi-host jobs, allreduce through shared memory within hosts and TCP across them, or (--no-...) "
            "over one flat TCP ring",
            action="boolean_optional",
        ),
    )
    hierarchical_allgather: bool = setting(
        True,
        parsers.parse_bool,
        "HORA_HIERARCHICAL_ALLGATHER",
        "HOROVOD_HIERARCHICAL_ALLGATHER",
        help=(
            "On jobs spanning several hosts: allgather and broadcast through shared memory within each host and "
            "TCP rings across hosts (1), or over one flat TCP ring (0). No effect on one host or with "
            "HORA_TRANSPORT=tcp."
        ),
        flag=Flag(
            "--hierarchical-allgather",
            "the same choice for allgather and broadcast",
            action="boolean_optional",
        ),
    )
    shm_chunk_bytes: int = setting(
        2 << 20,
        parsers.positive_int,
        "HORA_SHM_CHUNK_BYTES",
        help="Bytes each rank stages per step in the shared-memory transport (its slot holds two such buffers).",
    )
    tcp_chunk_bytes: int = setting(
        1 << 20,
        parsers.positive_int,
        "HORA_TCP_CHUNK_BYTES",
        help="Bytes per pipelined piece in the TCP ring.",
    )
    max_frame_bytes: int = setting(
        64 << 20,
        parsers.positive_int,
        "HORA_MAX_FRAME_BYTES",
        help="Largest control or rendezvous frame accepted from a peer; longer length fields are rejected unread.",
    )
