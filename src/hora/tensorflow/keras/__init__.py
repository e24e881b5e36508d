"""hora for Keras with TensorFlow, Horovod's ``horovod.tensorflow.keras`` names: ``import hora.tensorflow.keras
as hvd``. The same API as :mod:`hora.keras` (Keras 3; tf_keras optimizers under ``TF_USE_LEGACY_KERAS=1`` are
wrapped too), plus ``callbacks``; the TensorFlow collectives stay in :mod:`hora.tensorflow`.

This package sits a layer above :mod:`hora.tensorflow` (it uses :mod:`hora.keras`, which uses the TensorFlow ops).
"""

from __future__ import annotations

from hora.keras import (
    Adasum,
    Average,
    Compression,
    DistributedOptimizer,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_object,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    load_model,
    local_rank,
    local_size,
    rank,
    reducescatter,
    remove_process_set,
    shutdown,
    size,
)
from hora.tensorflow.keras import callbacks

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "callbacks",
    "cross_rank",
    "cross_size",
    "global_process_set",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "rank",
    "reducescatter",
    "remove_process_set",
    "shutdown",
    "size",
]
