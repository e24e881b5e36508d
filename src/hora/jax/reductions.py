"""Allreduce and reducescatter on JAX arrays (single and grouped), with Horovod's gradients (``jax.custom_vjp``):
the gradient of an allreduce is the allreduce of the gradient (same op and factors); of a reducescatter, the
allgather of the gradient (times the scale factors, divided by the number of ranks for Average). Integer and bool
inputs get no gradient (JAX's float0)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hora import _frontend as _f
from hora._dtypes import ReduceOp, even_counts
from hora._frontend import Average, ProcessSet, global_process_set
from hora._frontend.core import blocking, resolve_op
from hora.errors import UnsupportedError
from hora.jax.bridge import aligned_empty, check_dtype, is_tracing, run_op, spec, to_jax
from hora.jax.compression import Compression

__all__ = [
    "allreduce",
    "grouped_allreduce",
    "grouped_reducescatter",
    "reducescatter",
    "set_index",
    "set_size",
]


def set_size(process_set: ProcessSet | None) -> int:
    """The number of ranks in ``process_set`` (every rank for None)."""
    n = (process_set or global_process_set).size()
    if n is None:
        raise ValueError(f"{process_set!r} has not been added: call hvd.add_process_set(...) on every rank first")
    return n


def set_index(process_set: ProcessSet | None) -> int:
    """This rank's index in ``process_set``."""
    r = (process_set or global_process_set).rank()
    if r is None:
        raise ValueError(f"{process_set!r} has not been added: call hvd.add_process_set(...) on every rank first")
    return r


def differentiable(x: Any) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


def _check(xs: Sequence[Any], op: ReduceOp, pre: float, post: float, what: str) -> None:
    for x in xs:
        check_dtype(x.dtype, what)
        if x.dtype == jnp.bool_ and (op is ReduceOp.AVERAGE or pre != 1.0 or post != 1.0):
            raise UnsupportedError(f"{what} of a bool array supports Sum, Min, Max and Product without scale factors")


# -- allreduce -----------------------------------------------------------------------------------------------------
def raw_allreduce(
    xs: Sequence[Any], op: ReduceOp, pre: float, post: float, name: str | None, process_set: ProcessSet
) -> list[jax.Array]:
    """The reduced arrays, one callback (or one eager call) for the whole list; not differentiable."""
    _check(xs, op, pre, post, "allreduce")
    args: dict[str, Any] = dict(
        op=int(op), name=name, prescale_factor=pre, postscale_factor=post, process_set=process_set
    )

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = [aligned_empty(a.shape, a.dtype) for a in arrays]  # JAX adopts these without a copy
        if len(arrays) == 1:  # a single array keeps its name as given (a group's members get ".i" appended)
            blocking(lambda: _f.start_allreduce(arrays[0], inplace=False, out=outs[0], **args))
        else:
            blocking(lambda: _f.start_grouped_allreduce(arrays, inplace=False, outs=outs, **args))
        return outs

    return run_op(fn, xs, [spec(x.shape, x.dtype) for x in xs], "allreduce", adopt=True)


def _grouped_allreduce(
    xs: list[Any], op: ReduceOp, pre: float, post: float, name: str | None, process_set: ProcessSet
) -> list[jax.Array]:
    if not xs:
        return []
    if not is_tracing(xs):  # nothing can differentiate an eager call: skip custom_vjp's bookkeeping
        return raw_allreduce(xs, op, pre, post, name, process_set)
    inexact = [differentiable(x) for x in xs]

    @jax.custom_vjp
    def reduce(*ys: Any) -> list[jax.Array]:
        return raw_allreduce(ys, op, pre, post, name, process_set)

    def fwd(*ys: Any) -> tuple[list[jax.Array], None]:
        return reduce(*ys), None

    def bwd(_: None, gs: list[Any]) -> tuple[Any, ...]:
        at = [i for i, d in enumerate(inexact) if d]
        reduced = _grouped_allreduce([gs[i] for i in at], op, pre, post, None, process_set)
        out: list[Any] = [None] * len(gs)
        for i, r in zip(at, reduced):
            out[i] = r
        return tuple(out)

    reduce.defvjp(fwd, bwd)
    return list(reduce(*xs))


def _as_arrays(xs: Sequence[Any]) -> list[Any]:
    return [x if isinstance(x, (jax.Array, jax.core.Tracer)) else to_jax(np.asarray(x)) for x in xs]


def allreduce(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> jax.Array:
    """Reduce ``tensor`` over the ranks (default op Average) and return the result, a new array. Works eagerly and
    inside ``jax.jit``; differentiable (the gradient is reduced the same way)."""
    return grouped_allreduce([tensor], average, name, compression, op, prescale_factor, postscale_factor, process_set)[
        0
    ]


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[jax.Array]:
    """Reduce every array of the list as one group: one callback, negotiated and fused together."""
    resolved = _resolve(average, op)
    pairs = [compression.compress(x) for x in _as_arrays(tensors)]
    outs = _grouped_allreduce([c for c, _ in pairs], resolved, prescale_factor, postscale_factor, name, process_set)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def _resolve(average: bool | None, op: int | None, default: ReduceOp = Average) -> ReduceOp:
    return resolve_op(average, op, default)


# -- reducescatter -------------------------------------------------------------------------------------------------
def _scatter_rows(x: Any, process_set: ProcessSet) -> int:
    return even_counts(int(x.shape[0]), set_size(process_set))[set_index(process_set)]


def raw_reducescatter(
    xs: Sequence[Any], op: ReduceOp, pre: float, post: float, name: str | None, process_set: ProcessSet
) -> list[jax.Array]:
    _check(xs, op, pre, post, "reducescatter")
    for x in xs:
        if x.ndim == 0:
            raise ValueError("reducescatter: a 0-d array (scalar) cannot be scattered; it needs at least one dimension")

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        # The engine allocates each result for this call alone (no engine buffer is shared with it).
        if len(arrays) == 1:
            return [blocking(lambda: _f.reducescatter_async(arrays[0], int(op), name, pre, post, process_set))]
        return blocking(lambda: _f.grouped_reducescatter_async(arrays, int(op), name, pre, post, process_set))

    specs = [spec((_scatter_rows(x, process_set), *x.shape[1:]), x.dtype) for x in xs]
    return run_op(fn, xs, specs, "reducescatter")


def _grouped_reducescatter(
    xs: list[Any], op: ReduceOp, pre: float, post: float, name: str | None, process_set: ProcessSet
) -> list[jax.Array]:
    from hora.jax.movement import raw_allgather

    if not xs:
        return []
    if not is_tracing(xs):
        return raw_reducescatter(xs, op, pre, post, name, process_set)
    inexact = [differentiable(x) for x in xs]
    rows = [int(x.shape[0]) if x.ndim else 0 for x in xs]

    @jax.custom_vjp
    def scatter(*ys: Any) -> list[jax.Array]:
        return raw_reducescatter(ys, op, pre, post, name, process_set)

    def fwd(*ys: Any) -> tuple[list[jax.Array], None]:
        return scatter(*ys), None

    def bwd(_: None, gs: list[Any]) -> tuple[Any, ...]:
        at = [i for i, d in enumerate(inexact) if d]
        gathered, _counts = raw_allgather([gs[i] for i in at], [rows[i] for i in at], None, process_set)
        scale = pre * post / (set_size(process_set) if op is ReduceOp.AVERAGE else 1)
        out: list[Any] = [None] * len(gs)
        for i, g in zip(at, gathered):
            out[i] = g if scale == 1.0 else g * jnp.asarray(scale, g.dtype)
        return tuple(out)

    scatter.defvjp(fwd, bwd)
    return list(scatter(*xs))


def reducescatter(
    tensor: Any,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> jax.Array:
    """Reduce ``tensor`` over the ranks; rank r gets its share of dimension 0 (lower ranks take the remainder).
    Differentiable (the gradient is the allgather of the output's gradient)."""
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor)[0]


def grouped_reducescatter(
    tensors: Sequence[Any],
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[jax.Array]:
    """:func:`reducescatter` of every array of the list as one callback."""
    resolved = _resolve(None, op)
    pairs = [compression.compress(x) for x in _as_arrays(tensors)]
    outs = _grouped_reducescatter([c for c, _ in pairs], resolved, prescale_factor, postscale_factor, name, process_set)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]
