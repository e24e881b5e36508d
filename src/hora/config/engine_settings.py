"""The engine's settings: tensor fusion, the cycle time, the response cache, the stall check, the timeline and
autotune (docs/configuration.md's "Engine settings"). One group of :class:`hora.config.Config`
(:mod:`hora.config.settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from hora.config import parsers
from hora.config.fields import Flag, absolute_path, megabytes_flag, setting

__all__ = ["EngineSettings"]


@dataclass(frozen=True)
class EngineSettings:
    """The engine's settings."""

    fusion_threshold: int = setting(
        64 * 1024 * 1024,
        parsers.non_negative_int,
        "HORA_FUSION_THRESHOLD",
        "HOROVOD_FUSION_THRESHOLD",
        help=(
            "Largest fusion buffer in bytes: ready tensors are packed into one collective up to this size "
            "(0 disables fusion)."
        ),
        flag=megabytes_flag(
            "--fusion-threshold-mb", "fuse ready tensors into buffers of up to MB MiB; 0 disables fusion"
        ),
    )
    bucket_cap: int = setting(
        25 * 1024 * 1024,
        parsers.non_negative_int,
        "HORA_BUCKET_CAP",
        help=(
            "Gradient buckets of hora.torch.DistributedOptimizer and hora.mxnet.DistributedTrainer, in bytes (PyTorch "
            "DDP's bucket_cap_mb): the gradients, in reverse registration order, go in buckets of up to this size, "
            "each one grouped allreduce. Where an allreduce can run beside the backward pass (an accelerator, or a "
            "core left for each rank's engine thread) hora.torch submits each bucket the moment its last gradient "
            "is ready and makes the first one 1 MiB, so communication starts early; elsewhere (CPU ranks whose "
            "threads fill the cores) and in MXNet's trainer every bucket goes when the backward pass ends, the first "
            "as large as the others. 0: one allreduce per gradient (Horovod's way). groups= (num_groups=) "
            "overrides it."
        ),
        flag=megabytes_flag(
            "--bucket-cap-mb",
            "gradient buckets of up to MB MiB (torch and MXNet optimizers); 0: one allreduce per gradient",
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
        flag=Flag(
            "--cycle-time-ms",
            "milliseconds to gather asynchronous submissions into one negotiation cycle",
            metavar="MS",
        ),
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
        flag=Flag(
            "--stall-check-warning-time-seconds",
            "warn when a collective has waited S seconds for some ranks",
            metavar="S",
        ),
    )
    stall_shutdown_time: float = setting(
        1800.0,
        parsers.non_negative_float,
        "HORA_STALL_SHUTDOWN_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
        help="Seconds a collective may wait for the missing ranks before the stall check shuts the job down "
        "(0: never, Horovod's default). Default 1800, PyTorch's collective timeout: past any step, checkpoint or "
        "evaluation a rank does alone. If set, it must not be less than the stall check time; the default "
        "follows a longer check time.",
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
    system_metrics: str = setting(
        "",
        str,
        "HORA_SYSTEM_METRICS",
        help="File hora run appends its hosts' system metrics to, one JSON line a sample (time, host, name, value): "
        "CPU, memory, network and disk throughput of the launching host and of every -H host (empty: none).",
        flag=Flag(
            "--system-metrics",
            "append every host's CPU, memory, network and disk throughput to FILE (JSON lines), relative to this "
            "directory",
            metavar="FILE",
            group="run",
            convert=absolute_path,
            show_default=lambda p: p or "none",
        ),
    )
    system_metrics_interval: float = setting(
        0.5,
        parsers.positive_float,
        "HORA_SYSTEM_METRICS_INTERVAL",
        help="Seconds between two system metric samples of a host (SageMaker's default, 500 ms).",
        flag=Flag("--system-metrics-interval", "sample each host's system metrics every S seconds", metavar="S",
                  group="run"),
    )
    autotune: bool = setting(
        False,
        parsers.parse_bool,
        "HORA_AUTOTUNE",
        "HOROVOD_AUTOTUNE",
        help=(
            "Tune the fusion threshold, cycle time, response cache on/off and (across hosts) hierarchical "
            "allreduce/allgather during the first steps by Bayesian optimisation of bytes/s; rank 0 decides and "
            "every rank switches at the same engine cycle. Needs scikit-learn (pip install -c constraints.txt -e "
            "'.[autotune]' in hora's checkout)."
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
