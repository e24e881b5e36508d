"""hora for TensorFlow 2, with Horovod's API: ``import hora.tensorflow as hvd`` where a script had
``import horovod.tensorflow as hvd``.

Every collective works eagerly, inside ``tf.function`` and in ``tf.compat.v1`` graphs (Session), has Horovod's
gradient, and turns a mismatch across ranks into ``tf.errors.FailedPreconditionError`` on every rank
(:mod:`hora.tensorflow.bridge` says how). Keras: :mod:`hora.tensorflow.keras` (and :mod:`hora.keras`).
``SyncBatchNormalization`` is imported on first use (it needs Keras).
"""

from __future__ import annotations

from typing import Any

from hora._frontend import surface
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)
from hora.tensorflow import elastic, util
from hora.tensorflow.compression import (
    Compression,
)
from hora.tensorflow.data import (
    PipeModeDataset,
    shard,
)
from hora.tensorflow.functions import (
    BroadcastGlobalVariablesHook,
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from hora.tensorflow.gradient_tape import (
    DistributedGradientTape,
    PartialDistributedGradientTape,
)
from hora.tensorflow.movement import (
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    join,
)
from hora.tensorflow.mpi_ops import (
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from hora.tensorflow.optimizer import (
    DistributedOptimizer,
)
from hora.tensorflow.reductions import (
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from hora.tensorflow.util import _executing_eagerly  # noqa: F401  (Horovod scripts call hvd._executing_eagerly)

__all__ = [
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "PartialDistributedGradientTape",
    "PipeModeDataset",
    "SyncBatchNormalization",  # noqa: F405  (imported on first use: __getattr__ below)
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "elastic",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "join",
    "local_rank_op",
    "local_size_op",
    "process_set_included_op",
    "rank_op",
    "reducescatter",
    "shard",
    "size_op",
    "util",
]
__all__ += surface.__all__


def __getattr__(name: str) -> Any:
    if name == "SyncBatchNormalization":
        from hora.tensorflow.sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module 'hora.tensorflow' has no attribute {name!r}")
