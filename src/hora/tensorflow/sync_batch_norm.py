"""``SyncBatchNormalization``: Keras batch normalization whose batch statistics, in training, are computed over the
batches of every rank (one grouped allreduce of count, sum and sum of squares per call), as Horovod's is."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora.tensorflow.reductions import grouped_allreduce

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with the moments of every rank's batch (TensorFlow backend)."""

    def __init__(self, *args: Any, process_set: ProcessSet = global_process_set, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        axes = list(self._reduction_axes)
        x = tf.cast(inputs, tf.float32)
        if mask is None:
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
            total, squares, n = grouped_allreduce(
                [tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes), tf.reshape(count, [1])],
                op=ReduceOp.SUM,
                process_set=self.process_set,
            )
            mean = total / n
            variance = tf.maximum(squares / n - tf.square(mean), 0.0)
            return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
        # Keras 3's masked moments over every rank's batch: only the entries the mask keeps count, and the mean and
        # the variance divide by their number plus epsilon, as keras.layers.BatchNormalization does on one rank.
        weights = tf.broadcast_to(tf.cast(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.float32), tf.shape(x))
        kept = x * weights
        total, squares, n = grouped_allreduce(
            [tf.reduce_sum(kept, axes), tf.reduce_sum(kept * x, axes), tf.reduce_sum(weights, axes)],
            op=ReduceOp.SUM,
            process_set=self.process_set,
        )
        denominator = n + keras.backend.epsilon()
        mean = total / denominator
        # sum over kept entries of (x - mean)^2 = squares - 2 mean total + n mean^2
        variance = tf.maximum(squares - 2.0 * mean * total + n * tf.square(mean), 0.0) / denominator
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
