"""The settings of the parameter-server strategy: which strategy ``DistributedOptimizer`` uses, the servers
``hora run`` starts, their consistency, restarts and checkpoints (docs/ps.md). One group of
:class:`hora.config.Config` (:mod:`hora.config.settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from hora.config import parsers
from hora.config.fields import Flag, absolute_path, setting

__all__ = ["PsSettings"]


@dataclass(frozen=True)
class PsSettings:
    """The parameter-server strategy and its servers."""

    strategy: str = setting(
        "allreduce",
        parsers.choice("allreduce", "parameter_server"),
        "HORA_STRATEGY",
        help="How DistributedOptimizer shares gradients: 'allreduce', or 'parameter_server' (needs hora run --num-ps).",
        flag=Flag(
            "--strategy",
            "allreduce, or parameter servers",
            group="run",
            choices=("allreduce", "parameter_server"),
        ),
    )
    num_ps: int = setting(
        0,
        parsers.non_negative_int,
        "HORA_NUM_PS",
        help="Parameter servers hora run starts beside the workers.",
        flag=Flag("--num-ps", "start S parameter servers beside the workers", metavar="S", group="run"),
    )
    ps_per_host: int = setting(
        0,
        parsers.non_negative_int,
        "HORA_PS_PER_HOST",
        help=(
            "Parameter servers hora run starts on every host of the job "
            "(K x hosts in all; --num-ps, if given, must equal that)."
        ),
        flag=Flag(
            "--ps-per-host", "start K parameter servers on every host of the job", metavar="K", group="run"
        ),
    )
    ps_consistency: str = setting(
        "async",
        parsers.consistency,
        "HORA_PS_CONSISTENCY",
        help="Parameter servers' consistency: async, bounded(k) (no worker more than k steps ahead), or sync.",
        flag=Flag("--ps-consistency", "async, bounded(k) or sync", metavar="MODE", group="run"),
    )
    ps_max_restarts: int = setting(
        0,
        parsers.non_negative_int,
        "HORA_PS_MAX_RESTARTS",
        help="Times hora run restarts a parameter server that died, from its last checkpoint (needs "
        "HORA_PS_CHECKPOINT_DIR); 0: a dead server fails the job.",
        flag=Flag(
            "--max-restarts", "restart a dead parameter server up to R times", metavar="R", group="run"
        ),
    )
    ps_checkpoint_dir: str = setting(
        "",
        str,
        "HORA_PS_CHECKPOINT_DIR",
        help="Directory where every parameter server checkpoints its shards (DIR/ps<i>) and restores them from "
        "after a restart (empty: no automatic checkpoints).",
        flag=Flag(
            "--ps-checkpoint-dir",
            "parameter servers checkpoint their shards in DIR",
            metavar="DIR",
            convert=absolute_path,
            show_default=lambda p: p or "none",
            group="run",
        ),
    )
    ps_checkpoint_steps: int = setting(
        100,
        parsers.positive_int,
        "HORA_PS_CHECKPOINT_STEPS",
        help="A parameter server checkpoints a shard every this many updates applied to it (and when registered).",
        flag=Flag("--ps-checkpoint-steps", "checkpoint each shard every N updates", metavar="N", group="run"),
    )
    ps_single_copy: bool = setting(
        True,
        parsers.parse_bool,
        "HORA_PS_SINGLE_COPY",
        help="A parameter server on the worker's host reads dense gradients from the worker's arrays and writes the "
        "values into them (process_vm_readv/writev) where the kernel allows it; 0: through the shared segment.",
    )
