"""Allgather, broadcast and alltoall on JAX arrays, with Horovod's gradients (``jax.custom_vjp``): allgather → this
rank's rows of the summed gradient; broadcast → the summed gradient on the root, zeros elsewhere; alltoall → the
gradient sent back the way it came. Barrier and join are ordered callbacks inside a trace.

Inside a trace shapes are static, so there an allgather needs the same first dimension on every rank (checked:
every rank raises when they differ) and alltoall takes equal splits; eagerly both accept any split, as Horovod does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from hora import _frontend as _f
from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.core import blocking
from hora._frontend.process_set import root_index
from hora.jax.bridge import aligned_empty, check_dtype, is_tracing, run_op, spec
from hora.jax.reductions import _as_arrays, differentiable, raw_allreduce, set_index, set_size

__all__ = ["allgather", "alltoall", "barrier", "broadcast", "grouped_allgather", "join", "raw_allgather"]


# -- allgather -----------------------------------------------------------------------------------------------------
def raw_allgather(
    xs: Sequence[Any], totals: Sequence[int] | None, name: str | None, process_set: ProcessSet
) -> tuple[list[jax.Array], jax.Array]:
    """Every rank's arrays concatenated along dimension 0, and a (ranks, len(xs)) int32 array of how many rows each
    rank sent. ``totals``: the rows each result has (inside a trace; default: every rank sends as many as this
    one)."""
    for x in xs:
        check_dtype(x.dtype, "allgather")
    n = set_size(process_set)
    rows = [int(x.shape[0]) if x.ndim else 1 for x in xs]
    expected = list(totals) if totals is not None else [n * r for r in rows]

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        mine = np.asarray([[a.shape[0] if a.ndim else 1 for a in arrays]], np.int32)
        *gathered, counts = blocking(lambda: _f.grouped_allgather_async([*arrays, mine], name, process_set))
        for i, g in enumerate(gathered):
            if g.shape[0] != expected[i]:  # every rank sees the same counts, so every rank raises
                per_rank = ", ".join(f"rank {r}: {int(c)}" for r, c in enumerate(counts[:, i]))
                raise ValueError(
                    f"allgather inside a JAX trace (jit, grad) needs the same first dimension on every rank, as "
                    f"output shapes are static; got {per_rank}. Pad to a common length, or call hora.jax.allgather "
                    "outside jax.jit"
                )
        return [*gathered, counts]

    specs = [spec((t, *x.shape[1:]), x.dtype) for t, x in zip(expected, xs)] + [spec((n, len(xs)), np.int32)]
    *outs, counts = run_op(fn, xs, specs, "allgather")
    return outs, counts


def _grouped_allgather(xs: list[Any], name: str | None, process_set: ProcessSet) -> list[jax.Array]:
    if not xs:
        return []
    if not is_tracing(xs):
        for x in xs:
            check_dtype(x.dtype, "allgather")
        return run_op(
            lambda *a: blocking(lambda: _f.grouped_allgather_async(a, name, process_set)), xs, [], "allgather"
        )
    inexact = [differentiable(x) for x in xs]
    shapes = [x.shape for x in xs]

    @jax.custom_vjp
    def gather(*ys: Any) -> list[jax.Array]:
        return raw_allgather(ys, None, name, process_set)[0]

    def fwd(*ys: Any) -> tuple[list[jax.Array], jax.Array]:
        outs, counts = raw_allgather(ys, None, name, process_set)
        return outs, counts

    def bwd(counts: jax.Array, gs: list[Any]) -> tuple[Any, ...]:
        at = [i for i, d in enumerate(inexact) if d]
        summed = raw_allreduce([gs[i] for i in at], ReduceOp.SUM, 1.0, 1.0, None, process_set)
        me = set_index(process_set)
        out: list[Any] = [None] * len(gs)
        for i, g in zip(at, summed):
            own = int(shapes[i][0]) if shapes[i] else 1
            start = jnp.sum(counts[:me, i])
            out[i] = jax.lax.dynamic_slice_in_dim(g, start, own, axis=0).reshape(shapes[i])
        return tuple(out)

    gather.defvjp(fwd, bwd)
    return list(gather(*xs))


def allgather(
    tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> jax.Array:
    """Concatenate every rank's ``tensor`` along dimension 0 (eagerly its length may differ per rank; inside a
    trace it must not). Differentiable: each rank gets its rows of the summed gradient."""
    return _grouped_allgather(_as_arrays([tensor]), name, process_set)[0]


def grouped_allgather(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[jax.Array]:
    """:func:`allgather` of every array of the list as one callback."""
    return _grouped_allgather(_as_arrays(tensors), name, process_set)


# -- broadcast -----------------------------------------------------------------------------------------------------
def raw_broadcast(
    xs: Sequence[Any], root_rank: int, name: str | None, process_set: ProcessSet
) -> list[jax.Array]:
    for x in xs:
        check_dtype(x.dtype, "broadcast")
    root_index(process_set, root_rank)  # a root outside the set fails here, before anything is sent
    names = [name] if len(xs) == 1 else [None if name is None else f"{name}.{i}" for i in range(len(xs))]

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = [aligned_empty(a.shape, a.dtype) for a in arrays]  # JAX adopts these without a copy

        def start() -> _f.GroupHandle:
            return _f.GroupHandle(
                [
                    _f.start_broadcast(a, root_rank, inplace=False, out=o, name=nm, process_set=process_set)
                    for a, o, nm in zip(arrays, outs, names)
                ]
            )

        blocking(start)
        return outs

    return run_op(fn, xs, [spec(x.shape, x.dtype) for x in xs], "broadcast", adopt=True)


def grouped_broadcast(xs: list[Any], root_rank: int, name: str | None, process_set: ProcessSet) -> list[jax.Array]:
    """Broadcast a list as one callback; differentiable (the root receives the summed gradient)."""
    if not xs:
        return []
    if not is_tracing(xs):
        return raw_broadcast(xs, root_rank, name, process_set)
    inexact = [differentiable(x) for x in xs]

    @jax.custom_vjp
    def bcast(*ys: Any) -> list[jax.Array]:
        return raw_broadcast(ys, root_rank, name, process_set)

    def fwd(*ys: Any) -> tuple[list[jax.Array], None]:
        return bcast(*ys), None

    def bwd(_: None, gs: list[Any]) -> tuple[Any, ...]:
        at = [i for i, d in enumerate(inexact) if d]
        summed = raw_allreduce([gs[i] for i in at], ReduceOp.SUM, 1.0, 1.0, None, process_set)
        root = set_index(process_set) == root_index(process_set, root_rank)
        out: list[Any] = [None] * len(gs)
        for i, g in zip(at, summed):
            out[i] = g if root else jnp.zeros_like(g)
        return tuple(out)

    bcast.defvjp(fwd, bwd)
    return list(bcast(*xs))


def broadcast(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> jax.Array:
    """``root_rank``'s ``tensor`` on every rank, as a new array. Differentiable (the root receives the summed
    gradient, the other ranks zeros)."""
    return grouped_broadcast(_as_arrays([tensor]), root_rank, name, process_set)[0]


# -- alltoall ------------------------------------------------------------------------------------------------------
def _raw_alltoall(x: Any, splits: Any, name: str | None, process_set: ProcessSet) -> tuple[jax.Array, jax.Array]:
    check_dtype(x.dtype, "alltoall")
    if x.ndim == 0:
        raise ValueError("alltoall needs an array with at least one dimension")
    n = set_size(process_set)

    def fn(arr: np.ndarray) -> list[np.ndarray]:
        out, received = blocking(lambda: _f.alltoall_async(arr, splits, name, process_set))
        return [out, np.asarray(received, np.int32)]

    if is_tracing([x]):
        if splits is not None:
            raise ValueError(
                "alltoall with splits cannot run inside a JAX trace (jit, grad): how many rows arrive is known only "
                "when it runs, and traced shapes are static. Use equal splits (splits=None) there, or call "
                "hora.jax.alltoall with splits outside jax.jit"
            )
        if x.shape[0] % n:
            raise ValueError(
                f"alltoall without splits needs the first dimension ({x.shape[0]}) to be divisible by the number "
                f"of ranks ({n})"
            )
    out, received = run_op(fn, [x], [spec(x.shape, x.dtype), spec((n,), np.int32)], "alltoall")
    return out, received


def alltoall(
    tensor: Any, splits: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Rows ``splits[r]`` of ``tensor`` go to rank r (equal parts without ``splits``); returns what this rank
    received, and — when ``splits`` is given — how many rows came from each rank. Differentiable inside a trace
    (equal splits): the gradient goes back the way the rows came."""
    (x,) = _as_arrays([tensor])
    split_list = None if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    if not is_tracing([x]):
        out, received = _raw_alltoall(x, split_list, name, process_set)
        return out if splits is None else (out, received)
    if not differentiable(x):
        return _raw_alltoall(x, split_list, name, process_set)[0]

    @jax.custom_vjp
    def exchange(y: Any) -> jax.Array:
        return _raw_alltoall(y, split_list, name, process_set)[0]

    def fwd(y: Any) -> tuple[jax.Array, None]:
        return exchange(y), None

    def bwd(_: None, g: Any) -> tuple[Any]:
        return (_raw_alltoall(g, None, None, process_set)[0],)

    exchange.defvjp(fwd, bwd)
    return exchange(x)


# -- barrier and join ----------------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank (of ``process_set``) reaches the barrier: now when eager, when the computation runs
    inside a trace (an ordered callback, so it keeps its place among the other collectives)."""
    if not is_tracing([]):
        jax.effects_barrier()
        _f.barrier(process_set)
        return

    def host() -> None:
        _f.barrier(process_set)

    io_callback(host, None, ordered=True)


def join(device: int = -1) -> jax.Array:
    """This rank has no more data: until every rank has joined, it contributes zeros to the others' allreduces.
    Returns the rank that joined last (an int32 array). ``device`` is accepted for Horovod compatibility."""
    if not is_tracing([]):
        jax.effects_barrier()
        return jnp.asarray(_f.join(), jnp.int32)
    return io_callback(lambda: np.asarray(_f.join(), np.int32), spec((), np.int32), ordered=True)
