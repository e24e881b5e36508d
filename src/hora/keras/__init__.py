"""hora for Keras 3 (the multi-backend package), with Horovod's ``horovod.keras`` names: ``import hora.keras as
hvd``. ``DistributedOptimizer`` works on the TensorFlow, torch and JAX backends (and wraps tf_keras optimizers); the
callbacks and the value collectives work on any backend."""

from __future__ import annotations

from hora._frontend import surface
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)
from hora.keras import callbacks, elastic
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
from hora.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "callbacks",
    "elastic",
    "load_model",
    "reducescatter",
]
__all__ += surface.__all__
