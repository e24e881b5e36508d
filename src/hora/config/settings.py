"""Every hora setting, declared once: its name, type, default, environment variables, help, and the ``hora run``
flag that sets it.

Precedence: an explicit argument (``init(**overrides)`` or ``Config.resolve(overrides=...)``) beats a ``hora run``
flag, which beats the environment, which beats the default. ``hora run`` turns its flags into ``HORA_*``
environment variables for the workers, so inside a worker "flag" and "environment" are the same source and the
launcher's flag wins because the launcher overwrites the inherited variable. Every ``HORA_*`` variable that has a
Horovod counterpart also accepts the ``HOROVOD_*`` name (the ``HORA_*`` name wins when both are set).

The ``hora run`` command line is generated from the :class:`Flag` of each setting (:mod:`hora.runner.flags`), so a
flag's help states the setting's real default and variable.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hora.config import parsers
from hora.config.fields import Flag, absolute_path, read_settings, setting
from hora.errors import ConfigError

__all__ = ["Config", "Flag", "describe_settings", "env_names", "flag_of", "parse_value", "render", "settings_with_flags"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    """Resolved settings of one hora process. Build it with :meth:`Config.resolve`."""

    start_timeout: float = setting(
        30.0,
        parsers.positive_float,
        "HORA_START_TIMEOUT",
        "HOROVOD_START_TIMEOUT",
        help="Seconds every rank may take to reach the rendezvous before start-up fails naming the missing ranks.",
        flag=Flag("--start-timeout", "seconds every rank may take to reach the rendezvous", metavar="SECONDS", group="run"),
    )
    op_timeout: float = setting(
        300.0,
        parsers.positive_float,
        "HORA_OP_TIMEOUT_SECONDS",
        "HOROVOD_GLOO_TIMEOUT_SECONDS",
        help="Seconds a rank waits without progress (no bytes from or to a peer) inside an already negotiated "
        "collective before raising; a slow transfer that keeps moving never times out.",
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
            "--hierarchical-allgather", "the same choice for allgather and broadcast", action="boolean_optional"
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
    fusion_threshold: int = setting(
        64 * 1024 * 1024,
        parsers.non_negative_int,
        "HORA_FUSION_THRESHOLD",
        "HOROVOD_FUSION_THRESHOLD",
        help="Largest fusion buffer in bytes: ready tensors are packed into one collective up to this size (0 disables fusion).",
        flag=Flag(
            "--fusion-threshold-mb",
            "fuse ready tensors into buffers of up to MB MiB; 0 disables fusion",
            metavar="MB",
            convert=parsers.megabytes,
            show_default=lambda b: f"{b / 2**20:g}",
            unit="in bytes",
        ),
    )
    cycle_time_ms: float = setting(
        1.0,
        parsers.non_negative_float,
        "HORA_CYCLE_TIME",
        "HOROVOD_CYCLE_TIME",
        help=(
            "Milliseconds the engine waits after new asynchronous work arrives before negotiating, so a burst "
            "(a backward pass) is negotiated and fused in one cycle; also the pause between cycles while "
            "collectives are in flight. A thread blocked on its own collective does not wait."
        ),
        flag=Flag("--cycle-time-ms", "milliseconds to gather asynchronous submissions into one negotiation cycle", metavar="MS"),
    )
    cache_capacity: int = setting(
        1024,
        parsers.non_negative_int,
        "HORA_CACHE_CAPACITY",
        "HOROVOD_CACHE_CAPACITY",
        help="Entries in the response cache, which lets repeated collectives skip negotiation (0 disables the cache).",
        flag=Flag("--cache-capacity", "entries in the response cache; 0 disables it", metavar="N"),
    )
    stall_check_disable: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_STALL_CHECK_DISABLE",
        "HOROVOD_STALL_CHECK_DISABLE",
        help="Turn off the stall check (the warning about collectives some ranks submitted and others did not).",
        flag=Flag("--no-stall-check", "turn off the stall check", action="store_true"),
    )
    stall_check_time: float = setting(
        60.0,
        parsers.positive_float,
        "HORA_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_STALL_CHECK_TIME_SECONDS",
        help="Seconds a collective may wait for ranks that have not submitted it before the stall check warns.",
        flag=Flag("--stall-check-warning-time-seconds", "warn when a collective has waited S seconds for some ranks", metavar="S"),
    )
    stall_shutdown_time: float = setting(
        0.0,
        parsers.non_negative_float,
        "HORA_STALL_SHUTDOWN_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
        help="Seconds a collective may wait for the missing ranks before the stall check shuts the job down "
        "(0: never). If set, it must not be less than the stall check time.",
        flag=Flag(
            "--stall-check-shutdown-time-seconds",
            "shut the job down when a collective has waited S seconds for some ranks; 0 never, else at least "
            "the warning time",
            metavar="S",
        ),
    )
    timeline: str = setting(
        "",
        str,
        "HORA_TIMELINE",
        "HOROVOD_TIMELINE",
        help="File to record the engine's timeline in (empty: no timeline).",
        flag=Flag(
            "--timeline-filename",
            "record a timeline in PATH, relative to this directory",
            metavar="PATH",
            convert=absolute_path,  # the workers may run elsewhere: they get the path as seen from here
            show_default=lambda p: p or "none",
        ),
    )
    timeline_mark_cycles: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_TIMELINE_MARK_CYCLES",
        "HOROVOD_TIMELINE_MARK_CYCLES",
        help="Mark the start of every engine cycle in the timeline.",
        flag=Flag("--timeline-mark-cycles", "mark every engine cycle in the timeline", action="store_true"),
    )
    autotune: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_AUTOTUNE",
        "HOROVOD_AUTOTUNE",
        help=(
            "Tune the fusion threshold, cycle time, response cache on/off and (across hosts) hierarchical "
            "allreduce/allgather during the first steps by Bayesian optimisation of bytes/s; rank 0 decides and "
            "every rank switches at the same engine cycle. Needs scikit-learn (pip install 'hora[autotune]')."
        ),
        flag=Flag("--autotune", "tune the engine settings during the first steps", action="store_true"),
    )
    autotune_log_file: str = setting(
        "",
        str,
        "HORA_AUTOTUNE_LOG",
        "HOROVOD_AUTOTUNE_LOG",
        help="CSV file where rank 0 writes every autotune sample and, last, the chosen point (empty: no log).",
        flag=Flag(
            "--autotune-log-file",
            "write autotune's samples as CSV to PATH, relative to this directory",
            metavar="PATH",
            convert=absolute_path,
            show_default=lambda p: p or "none",
        ),
    )
    autotune_warmup_samples: int = setting(
        3,
        parsers.non_negative_int,
        "HORA_AUTOTUNE_WARMUP_SAMPLES",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
        help="Samples autotune takes with the starting settings and discards before it scores any.",
        flag=Flag("--autotune-warmup-samples", "samples to discard before autotune scores any", metavar="N"),
    )
    autotune_steps_per_sample: int = setting(
        10,
        parsers.positive_int,
        "HORA_AUTOTUNE_STEPS_PER_SAMPLE",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
        help=(
            "Steps in one autotune sample: a sample ends when some collective has completed this many times "
            "under its name since the sample began."
        ),
        flag=Flag("--autotune-steps-per-sample", "steps scored together as one autotune sample", metavar="N"),
    )
    autotune_bayes_opt_max_samples: int = setting(
        20,
        parsers.positive_int,
        "HORA_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
        help="Scored samples (points tried) before autotune settles on the best point seen.",
        flag=Flag(
            "--autotune-bayes-opt-max-samples", "points autotune tries before it keeps the best", metavar="N"
        ),
    )
    autotune_gaussian_process_noise: float = setting(
        0.8,
        parsers.non_negative_float,
        "HORA_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        help="Noise (alpha) of the Gaussian process over normalised scores: higher trusts single samples less.",
        flag=Flag(
            "--autotune-gaussian-process-noise",
            "noise of autotune's Gaussian process; higher trusts one sample less",
            metavar="ALPHA",
        ),
    )
    strategy: str = setting(
        "allreduce", parsers.choice("allreduce", "parameter_server"), "HORA_STRATEGY",
        help="How DistributedOptimizer shares gradients: 'allreduce', or 'parameter_server' (needs hora run --num-ps).",
        flag=Flag("--strategy", "allreduce, or parameter servers", group="run", choices=("allreduce", "parameter_server")),
    )  # fmt: skip
    num_ps: int = setting(
        0, parsers.non_negative_int, "HORA_NUM_PS", help="Parameter servers hora run starts beside the workers.",
        flag=Flag("--num-ps", "start S parameter servers beside the workers", metavar="S", group="run"),
    )  # fmt: skip
    ps_per_host: int = setting(
        0, parsers.non_negative_int, "HORA_PS_PER_HOST",
        help="Parameter servers hora run starts on every host of the job (K x hosts in all; --num-ps, if given, must equal that).",
        flag=Flag("--ps-per-host", "start K parameter servers on every host of the job", metavar="K", group="run"),
    )  # fmt: skip
    ps_consistency: str = setting(
        "async", parsers.consistency, "HORA_PS_CONSISTENCY",
        help="Parameter servers' consistency: async, bounded(k) (no worker more than k steps ahead), or sync.",
        flag=Flag("--ps-consistency", "async, bounded(k) or sync", metavar="MODE", group="run"),
    )  # fmt: skip
    ps_max_restarts: int = setting(
        0, parsers.non_negative_int, "HORA_PS_MAX_RESTARTS",
        help="Times hora run restarts a parameter server that died, from its last checkpoint (needs "
             "HORA_PS_CHECKPOINT_DIR); 0: a dead server fails the job.",
        flag=Flag("--max-restarts", "restart a dead parameter server up to R times", metavar="R", group="run"),
    )  # fmt: skip
    ps_checkpoint_dir: str = setting(
        "", str, "HORA_PS_CHECKPOINT_DIR",
        help="Directory where every parameter server checkpoints its shards (DIR/ps<i>) and restores them from "
             "after a restart (empty: no automatic checkpoints).",
        flag=Flag("--ps-checkpoint-dir", "parameter servers checkpoint their shards in DIR", metavar="DIR",
                  convert=absolute_path, show_default=lambda p: p or "none", group="run"),
    )  # fmt: skip
    ps_checkpoint_steps: int = setting(
        100, parsers.positive_int, "HORA_PS_CHECKPOINT_STEPS",
        help="A parameter server checkpoints a shard every this many updates applied to it (and when registered).",
        flag=Flag("--ps-checkpoint-steps", "checkpoint each shard every N updates", metavar="N", group="run"),
    )  # fmt: skip
    ps_single_copy: bool = setting(
        True, parsers.parse_bool, "HORA_PS_SINGLE_COPY",
        help="A parameter server on the worker's host reads dense gradients from the worker's arrays and writes the "
             "values into them (process_vm_readv/writev) where the kernel allows it; 0: through the shared segment.",
    )  # fmt: skip
    log_level: str = setting(
        "WARNING", parsers.log_level, "HORA_LOG_LEVEL", "HOROVOD_LOG_LEVEL",
        help="Level of the 'hora' logger (trace, debug, info, warning, error, fatal).",
        flag=Flag("--log-level", "level of hora's own log messages in the workers", group="run", choices=parsers.LOG_LEVELS),
    )  # fmt: skip
    hostname: str = setting(
        "",
        str,
        "HORA_HOSTNAME",
        "HOROVOD_HOSTNAME",
        help="Name of this host as the launcher knows it; ranks with the same name share memory. Default: the host name.",
    )
    rendezvous_addr: str = setting(
        "",
        str,
        "HORA_RENDEZVOUS_ADDR",
        help="Address of the rendezvous store (set by 'hora run'). Without it, rank 0 hosts one and publishes it in HORA_RUNTIME_DIR.",
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
        help="Private (0700) directory for bootstrap files when no 'hora run' launched the job. Default: $TMPDIR/hora-<uid>.",
    )

    @classmethod
    def resolve(
        cls, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> Config:
        """Read every setting from ``env`` (default ``os.environ``), then apply explicit ``overrides``."""
        values, sources, problems = read_settings(dataclasses.fields(Config), os.environ if env is None else env, overrides or {})
        problems += _cross_check(values, sources, with_defaults=True)
        if problems:
            raise ConfigError("invalid hora settings:\n  " + "\n  ".join(problems))
        return cls(**values)

    def public_dict(self) -> dict[str, Any]:
        """The settings without secrets, for logs."""
        data = dataclasses.asdict(self)
        if data.get("secret"):
            data["secret"] = "<hidden>"
        return data

    @classmethod
    def env_for(cls, settings: Mapping[str, Any]) -> dict[str, str]:
        """Explicit settings as ``HORA_*`` variables for a launcher's workers, validated first. Every given setting
        is exported, defaults included, so an explicit argument beats a variable the workers would inherit."""
        values, sources, problems = read_settings(dataclasses.fields(Config), {}, settings)
        # Only settings given together are checked against each other here: one that is not given comes from the
        # workers' environment, which the workers check when they resolve their Config.
        problems += _cross_check(values, sources, with_defaults=False)
        if problems:
            raise ConfigError("invalid hora settings:\n  " + "\n  ".join(problems))
        return {env_names(k)[0]: render(values[k]) for k, v in settings.items() if v is not None}

    def to_env(self) -> dict[str, str]:
        """The settings as ``HORA_*`` environment variables (what a launcher hands its workers)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            out[f.metadata["env"][0]] = render(value)
        return out


def render(value: Any) -> str:
    """A setting's value as its environment variable spells it (bools as 0/1)."""
    return str(int(value) if isinstance(value, bool) else value)


def _cross_check(values: Mapping[str, Any], sources: Mapping[str, str], with_defaults: bool) -> list[str]:
    """Problems between settings that are valid one by one. A setting that was not given takes its default when
    ``with_defaults`` and is not checked otherwise; one given an invalid value is not checked."""

    def get(name: str) -> tuple[float, str] | None:
        if sources.get(name) == "":
            return None
        if name in values:
            return values[name], f"{sources[name]}={values[name]:g}"
        if with_defaults:
            default = getattr(Config(), name)
            return default, f"the default {env_names(name)[0]}={default:g}"
        return None

    problems = []
    shutdown, check = get("stall_shutdown_time"), get("stall_check_time")
    if shutdown is not None and check is not None and 0 < shutdown[0] < check[0]:
        problems.append(
            f"{shutdown[1]} is less than {check[1]}: the stall shutdown time must be 0 (never) or not less "
            "than the stall check time (Horovod, too, refuses a shutdown time below the warning time); raise "
            "HORA_STALL_SHUTDOWN_TIME_SECONDS, lower HORA_STALL_CHECK_TIME_SECONDS, or set the shutdown time to 0"
        )
    return problems


def env_names(setting: str) -> tuple[str, ...]:
    """The environment variables that set ``setting`` (first is hora's own name)."""
    for f in dataclasses.fields(Config):
        if f.name == setting:
            return tuple(f.metadata["env"])
    raise KeyError(setting)


def parse_value(setting: str, text: str) -> Any:
    """Parse ``text`` as a value of ``setting`` exactly as its environment variable is parsed.

    Raises:
        ValueError: the text is not a valid value; the message says what is expected.
        KeyError: there is no such setting.
    """
    for f in dataclasses.fields(Config):
        if f.name == setting:
            return f.metadata["parse"](text)
    raise KeyError(setting)


def describe_settings() -> str:
    """A table of every setting, for ``hora run --help-settings`` and the docs."""
    lines = []
    for f in dataclasses.fields(Config):
        lines.append(f"{' / '.join(f.metadata['env'])} (default {f.default!r})\n    {f.metadata['help']}")
    return "\n".join(lines)


def flag_of(setting: str) -> Flag | None:
    """The ``hora run`` flag of ``setting`` (None when it has none)."""
    for f in dataclasses.fields(Config):
        if f.name == setting:
            flag: Flag | None = f.metadata["flag"]
            return flag
    raise KeyError(setting)


def settings_with_flags() -> list[tuple[str, Flag, Any]]:
    """(setting, its flag, its default) for every setting ``hora run`` has a flag for, in declaration order."""
    return [(f.name, f.metadata["flag"], f.default) for f in dataclasses.fields(Config) if f.metadata["flag"]]
