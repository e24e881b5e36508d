"""Allreduce and reducescatter on TensorFlow tensors (single and grouped), with Horovod's gradients: the gradient of
an allreduce is the allreduce of the gradient (same op and factors); of a reducescatter, the allgather of the
gradient (divided by the number of ranks for Average). ``tf.IndexedSlices`` are reduced by allgathering their
values and indices, as Horovod does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hora import _frontend as _f
from hora._dtypes import ReduceOp
from hora._frontend import Average, ProcessSet, global_process_set
from hora._frontend.core import blocking
from hora._frontend.core import resolve_op as _frontend_resolve_op
from hora.errors import UnsupportedError
from hora.tensorflow.bridge import aligned_empty, check_dtype, run_op
from hora.tensorflow.compression import Compression

__all__ = ["allreduce", "grouped_allreduce", "grouped_reducescatter", "reducescatter", "resolve_op", "set_size"]


def resolve_op(average: bool | None, op: int | None) -> ReduceOp:
    """The reduce op from Horovod's ``op`` or its deprecated ``average`` argument."""
    return _frontend_resolve_op(average, op)


def set_size(process_set: ProcessSet | None) -> int:
    """The number of ranks in ``process_set`` (every rank for None)."""
    ps = process_set or global_process_set
    n = ps.size()
    if n is None:
        raise ValueError(f"{ps!r} has not been added: call hvd.add_process_set(...) on every rank first")
    return n


def _check(dtype: tf.DType, op: ReduceOp, prescale: float, postscale: float, what: str) -> None:
    check_dtype(dtype, what)
    if tf.as_dtype(dtype) == tf.bool and (op is ReduceOp.AVERAGE or prescale != 1.0 or postscale != 1.0):
        raise ValueError(f"{what} of a bool tensor supports Sum, Min, Max and Product without scale factors")


def _raw_grouped_allreduce(
    tensors: list[tf.Tensor],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    name: str | None,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    for t in tensors:
        _check(t.dtype, op, prescale, postscale, "allreduce")

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = [aligned_empty(a.shape, a.dtype) for a in arrays]
        args: dict[str, Any] = dict(
            op=int(op), name=name, prescale_factor=prescale, postscale_factor=postscale, process_set=process_set
        )
        if len(arrays) == 1:  # a single tensor keeps its name as given (a group's members get ".i" appended)
            blocking(lambda: _f.start_allreduce(arrays[0], inplace=False, out=outs[0], **args))
        else:
            blocking(lambda: _f.start_grouped_allreduce(arrays, inplace=False, outs=outs, **args))
        return outs

    return run_op(fn, tensors, [t.dtype for t in tensors], "HoraAllreduce", [t.shape for t in tensors])


def _grouped_allreduce(
    tensors: list[tf.Tensor],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    name: str | None,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    """Dense allreduce of a list as one op, differentiable (the gradient is reduced the same way)."""

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = _raw_grouped_allreduce(list(xs), op, prescale, postscale, name, process_set)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            dys_t = [tf.zeros_like(x) if d is None else tf.convert_to_tensor(d) for x, d in zip(xs, dys)]
            return _grouped_allreduce(dys_t, op, prescale, postscale, None, process_set)

        return ys, grad

    if not tensors:
        return []
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _sparse_allreduce(
    slices: tf.IndexedSlices, op: ReduceOp, name: str | None, process_set: ProcessSet, pre: float, post: float
) -> tf.IndexedSlices:
    from hora.tensorflow.movement import allgather

    if op is ReduceOp.ADASUM:  # Horovod's words
        raise UnsupportedError(
            "The Adasum reduction does not currently support sparse tensors. As a workaround please pass "
            "sparse_as_dense=True to DistributedOptimizer"
        )
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise UnsupportedError(f"allreduce of tf.IndexedSlices supports Average and Sum, not {op.name.title()}")
    if pre != 1.0 or post != 1.0:  # Horovod's NotImplementedError; ignoring them would change the result silently
        raise UnsupportedError(
            f"allreduce of tf.IndexedSlices does not support prescale_factor/postscale_factor (got {pre}, {post}); "
            "convert the gradient with tf.convert_to_tensor (sparse_as_dense=True) or leave the factors at 1.0"
        )
    values = allgather(slices.values, name=f"{name}.values" if name else None, process_set=process_set)
    indices = allgather(slices.indices, name=f"{name}.indices" if name else None, process_set=process_set)
    if op is ReduceOp.AVERAGE:
        values = values / tf.cast(set_size(process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Reduce ``tensor`` over all ranks (default op Average) and return the result. A ``tf.IndexedSlices`` is
    reduced by allgathering its values and indices (Average or Sum). Differentiable."""
    resolved = resolve_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, resolved, name, process_set, prescale_factor, postscale_factor)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    (out,) = _grouped_allreduce([compressed], resolved, prescale_factor, postscale_factor, name, process_set)
    return compression.decompress(out, ctx)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    name: str | None = None,
) -> list[Any]:
    """Reduce every tensor of the list as one group: one op, negotiated and fused together. ``tf.IndexedSlices``
    members are allgathered. Differentiable."""
    resolved = resolve_op(average, op)
    tensors = list(tensors)
    dense_at = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense_at]
    reduced = _grouped_allreduce([c for c, _ in pairs], resolved, prescale_factor, postscale_factor, name, process_set)
    out: list[Any] = list(tensors)
    for i, r, (_, ctx) in zip(dense_at, reduced, pairs):
        out[i] = compression.decompress(r, ctx)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = _sparse_allreduce(
                t, resolved, f"{name}.{i}" if name else None, process_set, prescale_factor, postscale_factor
            )
    return out


# -- reducescatter -------------------------------------------------------------------------------------------------
def _raw_grouped_reducescatter(
    tensors: list[tf.Tensor],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    name: str | None,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    for t in tensors:
        _check(t.dtype, op, prescale, postscale, "reducescatter")
        if t.shape.rank == 0:
            raise ValueError(
                "reducescatter: a 0-d tensor (scalar) cannot be scattered; it needs at least one dimension"
            )

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        # The engine allocates each result for this call alone (no engine buffer is shared with it).
        if len(arrays) == 1:
            return [
                blocking(lambda: _f.reducescatter_async(arrays[0], int(op), name, prescale, postscale, process_set))
            ]
        return blocking(lambda: _f.grouped_reducescatter_async(arrays, int(op), name, prescale, postscale, process_set))

    shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) for t in tensors]
    return run_op(fn, tensors, [t.dtype for t in tensors], "HoraReducescatter", shapes)


def _grouped_reducescatter(
    tensors: list[tf.Tensor],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    name: str | None,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    from hora.tensorflow.movement import grouped_allgather

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = _raw_grouped_reducescatter(list(xs), op, prescale, postscale, name, process_set)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            gathered = grouped_allgather([tf.convert_to_tensor(d) for d in dys], process_set=process_set)
            if op is ReduceOp.AVERAGE:
                gathered = [g / tf.cast(set_size(process_set), g.dtype) for g in gathered]
            return gathered

        return ys, grad

    if not tensors:
        return []
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: int = Average,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce ``tensor`` over ranks; rank r gets its share of dimension 0 (lower ranks take the remainder).
    Differentiable (the gradient is the allgather of the output's gradient)."""
    resolved = resolve_op(None, op)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    (out,) = _grouped_reducescatter([compressed], resolved, prescale_factor, postscale_factor, name, process_set)
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
) -> list[tf.Tensor]:
    """:func:`reducescatter` of every tensor of the list as one op."""
    resolved = resolve_op(None, op)
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _grouped_reducescatter([c for c, _ in pairs], resolved, prescale_factor, postscale_factor, name, process_set)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]
