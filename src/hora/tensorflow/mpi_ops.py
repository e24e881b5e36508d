"""The graph-time topology ops of Horovod's TensorFlow API (``horovod/tensorflow/mpi_ops.py``: ``rank_op`` ...), which
read the value when the graph runs, not when it is built. The lifecycle, topology and build queries themselves are
:mod:`hora._frontend.surface`'s, shared by every adapter."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from hora._frontend.surface import local_rank, local_size, rank
from hora._runtime.context import current
from hora.tensorflow.bridge import executing_eagerly

__all__ = [
    "local_rank_op",
    "local_size_op",
    "process_set_included_op",
    "rank_op",
    "size_op",
]

def _set_ranks(process_set_id: int) -> list[int]:
    ctx = current()
    if process_set_id == 0:
        return list(range(ctx.size))
    ranks = ctx.set_ranks.get(process_set_id)
    if ranks is None:
        raise ValueError(f"process set {process_set_id} is not registered (call add_process_set on every rank)")
    return list(ranks)


def _topology_op(value: Callable[[], int], name: str) -> tf.Tensor:
    """``value()`` as an int32 tensor: now when eager, when the graph runs otherwise (as Horovod's ops)."""
    if executing_eagerly():
        return tf.constant(value(), tf.int32)
    out = tf.numpy_function(lambda: np.int32(value()), [], tf.int32, stateful=True, name=name)
    out.set_shape([])
    return out


def rank_op(name: str | None = None) -> tf.Tensor:
    return _topology_op(rank, name or "HoraRank")


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    return _topology_op(lambda: len(_set_ranks(process_set_id)), name or "HoraSize")


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return _topology_op(local_rank, name or "HoraLocalRank")


def local_size_op(name: str | None = None) -> tf.Tensor:
    return _topology_op(local_size, name or "HoraLocalSize")


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    def included() -> int:
        return int(current().rank in _set_ranks(process_set_id))

    return _topology_op(included, name or "HoraProcessSetIncluded")
