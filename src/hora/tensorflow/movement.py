"""Allgather, broadcast, alltoall, join and barrier on TensorFlow tensors, with Horovod's gradients: allgather →
this rank's rows of the summed gradient; broadcast → the summed gradient on the root, zeros elsewhere; alltoall →
the gradient sent back with the received splits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hora import _frontend as _f
from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.core import blocking
from hora._frontend.process_set import root_index
from hora.tensorflow.bridge import aligned_empty, check_dtype, executing_eagerly, run_op

__all__ = ["allgather", "alltoall", "barrier", "broadcast", "broadcast_", "grouped_allgather", "join"]


def _rank_in(process_set: ProcessSet) -> int:
    r = (process_set or global_process_set).rank()
    if r is None:
        raise ValueError(f"{process_set!r} has not been added: call hvd.add_process_set(...) on every rank first")
    return r


# -- allgather -----------------------------------------------------------------------------------------------------
def _raw_grouped_allgather(tensors: list[tf.Tensor], name: str | None, process_set: ProcessSet) -> list[tf.Tensor]:
    for t in tensors:
        check_dtype(t.dtype, "allgather")

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        if len(arrays) == 1:  # a single tensor keeps its name as given (a group's members get ".i" appended)
            return [blocking(lambda: _f.allgather_async(arrays[0], name, process_set))]
        return blocking(lambda: _f.grouped_allgather_async(arrays, name, process_set))

    shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank != 0 else [None] for t in tensors]
    return run_op(fn, tensors, [t.dtype for t in tensors], "HoraAllgather", shapes)


def _grouped_allgather(tensors: list[tf.Tensor], name: str | None, process_set: ProcessSet) -> list[tf.Tensor]:
    from hora.tensorflow.reductions import grouped_allreduce

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = _raw_grouped_allgather(list(xs), name, process_set)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            summed = grouped_allreduce([tf.convert_to_tensor(d) for d in dys], op=ReduceOp.SUM, process_set=process_set)
            firsts = tf.stack(
                [tf.shape(x, out_type=tf.int64)[0] if x.shape.rank else tf.constant(1, tf.int64) for x in xs]
            )
            dims = tf.reshape(
                _raw_grouped_allgather([tf.reshape(firsts, [1, -1])], None, process_set)[0], [-1, len(xs)]
            )
            offsets = tf.reduce_sum(dims[: _rank_in(process_set)], axis=0)
            out = []
            for i, (x, g) in enumerate(zip(xs, summed)):
                rows = g[offsets[i] : offsets[i] + dims[_rank_in(process_set), i]]
                out.append(tf.reshape(rows, tf.shape(x)))
            return out

        return ys, grad

    if not tensors:
        return []
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def allgather(
    tensor: Any,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (its length may differ per rank). Differentiable."""
    return _grouped_allgather([tf.convert_to_tensor(tensor)], name, process_set)[0]


def grouped_allgather(
    tensors: Sequence[Any],
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """:func:`allgather` of every tensor of the list as one op."""
    return _grouped_allgather([tf.convert_to_tensor(t) for t in tensors], name, process_set)


# -- broadcast -----------------------------------------------------------------------------------------------------
def _raw_broadcast(
    tensors: list[tf.Tensor], root_rank: int, name: str | None, process_set: ProcessSet
) -> list[tf.Tensor]:
    for t in tensors:
        check_dtype(t.dtype, "broadcast")
    root_index(process_set, root_rank)  # a root outside the set fails here, at build time
    base = name

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = [aligned_empty(a.shape, a.dtype) for a in arrays]
        names = [base] if len(arrays) == 1 else [None if base is None else f"{base}.{i}" for i in range(len(arrays))]

        def start() -> _f.GroupHandle:
            return _f.GroupHandle(
                [
                    _f.start_broadcast(a, root_rank, inplace=False, out=o, process_set=process_set, name=nm)
                    for a, o, nm in zip(arrays, outs, names)
                ]
            )

        blocking(start)
        return outs

    return run_op(fn, tensors, [t.dtype for t in tensors], "HoraBroadcast", [t.shape for t in tensors])


def _grouped_broadcast(
    tensors: list[tf.Tensor], root_rank: int, name: str | None, process_set: ProcessSet
) -> list[tf.Tensor]:
    from hora.tensorflow.reductions import grouped_allreduce

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = _raw_broadcast(list(xs), root_rank, name, process_set)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            summed = grouped_allreduce([tf.convert_to_tensor(d) for d in dys], op=ReduceOp.SUM, process_set=process_set)
            if _rank_in(process_set) != root_index(process_set, root_rank):
                summed = [g * 0 for g in summed]
            return summed

        return ys, grad

    if not tensors:
        return []
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def broadcast(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """``root_rank``'s ``tensor`` on every rank. Differentiable (the root receives the summed gradient)."""
    return _grouped_broadcast([tf.convert_to_tensor(tensor)], root_rank, name, process_set)[0]


def broadcast_(
    variables: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Broadcast ``variables`` (one or a list) from ``root_rank`` in place, as one op. Eagerly the variables hold
    the root's values when this returns (and are returned); in a graph the assign ops are returned."""
    single = not isinstance(variables, (list, tuple))
    vs = [variables] if single else list(variables)
    values = _raw_broadcast([tf.convert_to_tensor(v) for v in vs], root_rank, name, process_set)
    assigns = [v.assign(x) for v, x in zip(vs, values)]
    if executing_eagerly():
        return variables
    group = tf.group(*assigns)
    return group if single else assigns


# -- alltoall ------------------------------------------------------------------------------------------------------
def _raw_alltoall(
    tensor: tf.Tensor, splits: tf.Tensor | None, name: str | None, process_set: ProcessSet
) -> tuple[tf.Tensor, tf.Tensor]:
    check_dtype(tensor.dtype, "alltoall")
    if tensor.shape.rank == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")

    def fn(arr: np.ndarray, *split: np.ndarray) -> list[np.ndarray]:
        out, received = blocking(lambda: _f.alltoall_async(arr, split[0] if split else None, name, process_set))
        return [out, np.asarray(received, np.int32)]

    inputs = [tensor] if splits is None else [tensor, tf.cast(splits, tf.int32)]
    shape = tf.TensorShape([None]).concatenate(tensor.shape[1:])
    out, received = run_op(fn, inputs, [tensor.dtype, tf.int32], "HoraAlltoall", [shape, [None]])
    return out, received


def alltoall(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[r]`` rows of ``tensor`` to rank r (equal parts without ``splits``). Returns the received
    rows and how many came from each rank (Horovod's ``(output, received_splits)``). Differentiable."""
    x = tf.convert_to_tensor(tensor)
    s = None if splits is None else tf.convert_to_tensor(splits)

    @tf.custom_gradient
    def forward(t: tf.Tensor) -> Any:
        out, received = _raw_alltoall(t, s, name, process_set)

        def grad(dy: tf.Tensor, *_: Any) -> tf.Tensor:
            back, _r = _raw_alltoall(tf.convert_to_tensor(dy), received, None, process_set)
            return tf.reshape(back, tf.shape(t))

        return (out, received), grad

    out, received = forward(x)
    return out, received


# -- join and barrier ----------------------------------------------------------------------------------------------
def join(name: str | None = None) -> tf.Tensor:
    """Signal that this rank has no more data; returns the rank that joined last (an int32 tensor)."""
    return run_op(lambda: [np.asarray(_f.join(), np.int32)], [], [tf.int32], "HoraJoin", [[]])[0]


def barrier(process_set: ProcessSet = global_process_set, name: str | None = None) -> Any:
    """Block until every rank (of ``process_set``) reaches the barrier: eagerly now, in a graph when the op runs."""
    if executing_eagerly():
        _f.barrier(process_set)
        return None
    return run_op(lambda: [_barrier_value(process_set)], [], [tf.int32], "HoraBarrier", [[]])[0].op


def _barrier_value(process_set: ProcessSet) -> np.ndarray:
    _f.barrier(process_set)
    return np.asarray(0, np.int32)
