"""hora for Keras 3 (the multi-backend package), with Horovod's ``horovod.keras`` names: ``import hora.keras as
hvd``. ``DistributedOptimizer`` works on the TensorFlow, torch and JAX backends (and wraps tf_keras optimizers); the
callbacks and the value collectives work on any backend."""

from __future__ import annotations

from hora._frontend import (
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
)
from hora.keras import callbacks
from hora.keras.compression import Compression
from hora.keras.functions import (
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_object,
    load_model,
    reducescatter,
)
from hora.keras.optimizer import DistributedOptimizer

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
