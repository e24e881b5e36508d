"""Horovod's ``horovod.tensorflow.keras.callbacks``: the callbacks of :mod:`hora.keras.callbacks`, on the base
classes of the Keras that ``tf.keras`` is: Keras 3, or tf_keras when ``TF_USE_LEGACY_KERAS=1``."""

from __future__ import annotations

import tensorflow as tf

from hora.keras import callbacks as _keras3
from hora.keras.callbacks import callback_classes

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]

if tf.keras.callbacks.Callback.__module__.startswith("tf_keras"):  # legacy Keras 2
    _made = callback_classes(tf.keras.callbacks.Callback, tf.keras.callbacks.ModelCheckpoint)
else:
    _made = {name: getattr(_keras3, name) for name in __all__}

BestModelCheckpoint = _made["BestModelCheckpoint"]
BroadcastGlobalVariablesCallback = _made["BroadcastGlobalVariablesCallback"]
LearningRateScheduleCallback = _made["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _made["LearningRateWarmupCallback"]
MetricAverageCallback = _made["MetricAverageCallback"]
