"""hora for JAX, with Horovod's names: ``import hora.jax as hvd`` (Horovod itself never supported JAX).

Every collective works eagerly (numpy views of the arrays, no copy in) and inside ``jax.jit`` / ``jax.grad`` /
``lax.scan`` (one ordered host callback per call or grouped call), with Horovod's gradients
(:mod:`hora.jax.bridge` says how). ``DistributedOptimizer`` wraps an optax ``GradientTransformation`` and is
imported on first use (it needs optax). Differences from what a Horovod or JAX user may expect: docs/jax.md.
"""

from __future__ import annotations

from typing import Any

from hora import elastic  # hvd.elastic: run, State, ObjectState (Horovod's horovod.common.elastic)
from hora._frontend import surface
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)
from hora.jax.compression import Compression
from hora.jax.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hora.jax.movement import (
    allgather,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    join,
)
from hora.jax.reductions import (
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)

__all__ = [
    "Compression",
    "DistributedOptimizer",  # noqa: F405  (imported on first use: __getattr__ below)
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "elastic",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "join",
    "reducescatter",
]
__all__ += surface.__all__


def __getattr__(name: str) -> Any:
    if name in ("DistributedOptimizer", "DistributedOptimizerState"):
        from hora.jax import optimizer

        return getattr(optimizer, name)
    raise AttributeError(f"module 'hora.jax' has no attribute {name!r}")
