"""Lifecycle, topology and build queries of Horovod's TensorFlow API (``horovod/tensorflow/mpi_ops.py``), with the
graph-time topology ops (``rank_op`` ...), which read the value when the graph runs, not when it is built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from hora import _frontend as _f
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
from hora._runtime.context import current
from hora.errors import UnsupportedError
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


def init(comm: Any = None, process_sets: Any = None, **settings: Any) -> None:
    """Start hora in this process (idempotent; ``init()`` after ``shutdown()`` starts afresh). ``settings``
    override :class:`hora.Config` fields (e.g. ``transport="tcp"``)."""
    if comm is not None:
        raise UnsupportedError(
            "init(comm=...) is not supported: hora takes its ranks from the launcher (hora run, mpirun, srun, "
            "torchrun); call init() without comm"
        )
    _f.init(**settings)
    if process_sets == "dynamic":  # Horovod's switch for add/remove after init: always on in hora
        return
    for ps in process_sets or []:
        add_process_set(ps)


# What this build has, answered honestly: hora's data planes are its own (shared memory and TCP).
def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    raise ValueError("Horovod MPI is not enabled; hora does not use MPI (it runs under mpirun without it).")


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


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
