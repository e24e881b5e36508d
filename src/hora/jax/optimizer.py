"""``DistributedOptimizer``: an optax ``GradientTransformation`` that averages the gradients over the ranks before
the wrapped transformation sees them — the whole gradient pytree in one grouped allreduce (one callback) per step.

``backward_passes_per_step=k`` works like ``optax.MultiSteps``: the first k - 1 calls add the gradients to a local
accumulator and return zero updates; the k-th reduces the accumulated sum across ranks (divided by k with
``average_aggregated_gradients=True``), updates, and starts again. The reduction sits in a ``lax.cond`` branch, so
it runs only on the k-th call (every rank takes the same branch: they count the same calls).
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora.jax.compression import Compression
from hora.jax.reductions import _resolve, grouped_allreduce, set_size

__all__ = ["DistributedOptimizer", "DistributedOptimizerState"]

_instances = itertools.count()


class DistributedOptimizerState(NamedTuple):
    """The state with ``backward_passes_per_step > 1`` (with 1 the wrapped transformation's state is used as is)."""

    mini_step: jax.Array  # int32: calls since the last update
    grad_acc: Any  # this rank's sum of the gradients of those calls
    inner_state: Any  # the wrapped transformation's state


def DistributedOptimizer(
    optimizer: optax.GradientTransformation,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    process_set: ProcessSet = global_process_set,
) -> optax.GradientTransformation:
    """Wrap ``optimizer`` so that ``update`` first reduces ``grads`` (a pytree) across ranks (default: average).

    Args:
        name: the collective's name (default ``DistributedOptimizer.<n>``, the n-th one this process made): a name
            that recurs every step is answered from hora's response cache.
        gradient_predivide_factor: with op=Average, divide by this before the sum and by size/this after.
        backward_passes_per_step: reduce and update every this many calls (see the module's docstring).
        average_aggregated_gradients: divide the accumulated gradients by ``backward_passes_per_step`` (Horovod's
            default, False, applies their sum).
    """
    resolved = _resolve(None, op)
    if gradient_predivide_factor != 1.0 and resolved is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor needs op=Average (it splits the averaging around the sum)")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
    base = name if name is not None else f"DistributedOptimizer.{next(_instances)}"
    k = backward_passes_per_step

    def reduce(grads: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        op_, pre, post = resolved, 1.0, 1.0
        if resolved is ReduceOp.AVERAGE and gradient_predivide_factor != 1.0:
            op_, pre = ReduceOp.SUM, 1.0 / gradient_predivide_factor
            post = gradient_predivide_factor / set_size(process_set)
        reduced = grouped_allreduce(
            leaves, name=f"{base}.grads", compression=compression, op=int(op_), prescale_factor=pre,
            postscale_factor=post, process_set=process_set,
        )  # fmt: skip
        return jax.tree_util.tree_unflatten(treedef, reduced)

    if k == 1:

        def update_one(updates: Any, state: Any, params: Any = None) -> Any:
            return optimizer.update(reduce(updates), state, params)

        return optax.GradientTransformation(optimizer.init, update_one)

    def init(params: Any) -> DistributedOptimizerState:
        return DistributedOptimizerState(
            jnp.zeros([], jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, params), optimizer.init(params)
        )

    def update(updates: Any, state: DistributedOptimizerState, params: Any = None) -> Any:
        acc = jax.tree_util.tree_map(jnp.add, state.grad_acc, updates)

        def apply(_: Any) -> Any:
            total = reduce(acc)
            if average_aggregated_gradients:
                total = jax.tree_util.tree_map(lambda t: t / k, total)
            new_updates, inner = optimizer.update(total, state.inner_state, params)
            zeros = jax.tree_util.tree_map(jnp.zeros_like, acc)
            return new_updates, DistributedOptimizerState(jnp.zeros([], jnp.int32), zeros, inner)

        def skip(_: Any) -> Any:
            zeros = jax.tree_util.tree_map(jnp.zeros_like, updates)
            return zeros, DistributedOptimizerState(state.mini_step + 1, acc, state.inner_state)

        return jax.lax.cond(state.mini_step >= k - 1, apply, skip, None)

    return optax.GradientTransformation(init, update)
