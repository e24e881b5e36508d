"""hora for Keras with TensorFlow, Horovod's ``horovod.tensorflow.keras`` names: ``import hora.tensorflow.keras
as hvd``. The names every adapter shares (:mod:`hora._frontend.surface`) and the same Keras API as :mod:`hora.keras`
(Keras 3; tf_keras optimizers under ``TF_USE_LEGACY_KERAS=1`` are wrapped too), plus ``callbacks``; the TensorFlow
collectives stay in :mod:`hora.tensorflow`.

This package sits a layer above :mod:`hora.tensorflow` (it uses :mod:`hora.keras`, which uses the TensorFlow ops).
"""

from __future__ import annotations

from hora._frontend import surface
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)
from hora.keras import (
    Compression,
    DistributedOptimizer,
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_object,
    load_model,
    reducescatter,
)
from hora.tensorflow.keras import callbacks, elastic

__all__ = [
    "Compression",
    "DistributedOptimizer",
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
