"""``hora.tensorflow.keras.elastic`` (Horovod's ``horovod.tensorflow.keras.elastic``): ``run``, ``KerasState`` (a
:class:`~hora.tensorflow.elastic.TensorFlowKerasState` with ``tf.keras``' backend) and the elastic callbacks of
:mod:`hora.keras.elastic` on ``tf.keras``' callback class (tf_keras when ``TF_USE_LEGACY_KERAS=1``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._frontend.elastic import ObjectState, State
from hora.keras.elastic import elastic_callback_classes
from hora.tensorflow.elastic import TensorFlowKerasState, run

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "ObjectState",
    "State",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


class KerasState(TensorFlowKerasState):
    """A ``tf.keras`` model and its optimizer (default ``model.optimizer``), plus plain attributes."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


_made = elastic_callback_classes(tf.keras.callbacks.Callback)
CommitStateCallback = _made["CommitStateCallback"]
UpdateBatchStateCallback = _made["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _made["UpdateEpochStateCallback"]
