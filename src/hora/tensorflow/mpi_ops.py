"""Lifecycle, topology and build queries of Horovod's TensorFlow API (``horovod/tensorflow/mpi_ops.py``), with the
graph-time topology ops (``rank_op`` ...), which read the value when the graph runs, not when it is built."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

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
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hora._frontend.horovod_compat import (  # Horovod's init and build queries, as every adapter answers them
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hora._runtime.context import current
from hora.tensorflow.bridge import executing_eagerly

__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
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
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]

HorovodInternalError = tf.errors.UnknownError
"""What a collective that failed inside a graph raises (other than a mismatch: FailedPreconditionError)."""


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
