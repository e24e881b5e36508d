"""hora for TensorFlow 2, with Horovod's API: ``import hora.tensorflow as hvd`` where a script had
``import horovod.tensorflow as hvd``.

Every collective works eagerly, inside ``tf.function`` and in ``tf.compat.v1`` graphs (Session), has Horovod's
gradient, and turns a mismatch across ranks into ``tf.errors.FailedPreconditionError`` on every rank
(:mod:`hora.tensorflow.bridge` says how). Keras: :mod:`hora.tensorflow.keras` (and :mod:`hora.keras`).
``SyncBatchNormalization`` is imported on first use (it needs Keras).
"""

from __future__ import annotations

from typing import Any

from hora.tensorflow import util
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
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_rank_op,
    local_size,
    local_size_op,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    process_set_included_op,
    rank,
    rank_op,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    size_op,
    start_timeline,
    stop_timeline,
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
    "Adasum",
    "Average",
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "PipeModeDataset",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
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
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shard",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
    "util",
]


def __getattr__(name: str) -> Any:
    if name == "SyncBatchNormalization":
        from hora.tensorflow.sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module 'hora.tensorflow' has no attribute {name!r}")
