"""The settings a launcher hands each process of a job: the level of hora's log, the host name, where the
rendezvous store is, the job's secret, id and attempt, the addresses and ports to bind, and the private directory
used when no launcher did. One group of :class:`hora.config.Config` (:mod:`hora.config.settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from hora.config import parsers
from hora.config.fields import Flag, setting

__all__ = ["LaunchSettings"]


@dataclass(frozen=True)
class LaunchSettings:
    """What the launcher tells each process about its job and its host."""

    log_level: str = setting(
        "WARNING",
        parsers.log_level,
        "HORA_LOG_LEVEL",
        "HOROVOD_LOG_LEVEL",
        help="Level of the 'hora' logger (trace, debug, info, warning, error, fatal).",
        flag=Flag(
            "--log-level",
            "level of hora's own log messages in the workers",
            group="run",
            choices=parsers.LOG_LEVELS,
        ),
    )
    hostname: str = setting(
        "",
        str,
        "HORA_HOSTNAME",
        "HOROVOD_HOSTNAME",
        help=(
            "Name of this host as the launcher knows it; ranks with the same name share memory. "
            "Default: the host name."
        ),
    )
    rendezvous_addr: str = setting(
        "",
        str,
        "HORA_RENDEZVOUS_ADDR",
        help=(
            "Address of the rendezvous store (set by 'hora run'). Without it, rank 0 hosts one and publishes it "
            "in HORA_RUNTIME_DIR."
        ),
    )
    rendezvous_port: int = setting(
        0,
        int,
        "HORA_RENDEZVOUS_PORT",
        help="Port of the rendezvous store (set by 'hora run').",
    )
    secret: str = setting(
        "",
        str,
        "HORA_SECRET",
        help="Per-job secret, hex (set by 'hora run'; never put it on a command line).",
    )
    secret_file: str = setting(
        "",
        str,
        "HORA_SECRET_FILE",
        help="Path of a 0600 file holding the per-job secret in hex (alternative to HORA_SECRET).",
    )
    job_id: str = setting(
        "",
        str,
        "HORA_JOB_ID",
        help="Identifier of the job; rendezvous keys are namespaced by it (set by 'hora run').",
    )
    attempt: int = setting(
        0,
        int,
        "HORA_ATTEMPT",
        help="Restart attempt of the job; rendezvous keys are namespaced by it.",
    )
    bind_addr: str = setting(
        "",
        str,
        "HORA_BIND_ADDR",
        help="Address this rank's servers bind and advertise. Default: 127.0.0.1 when every rank is on this host.",
    )
    port_range: str = setting(
        "",
        parsers.port_range,
        "HORA_PORT_RANGE",
        help="Ports (LOW-HIGH) each rank's listener may bind, for firewalls between hosts. Default: any free port.",
    )
    runtime_dir: str = setting(
        "",
        str,
        "HORA_RUNTIME_DIR",
        help=(
            "Private (0700) directory for bootstrap files when no 'hora run' launched the job. "
            "Default: $TMPDIR/hora-<uid>."
        ),
    )
