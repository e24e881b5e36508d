"""``DistributedOptimizer``: an optax ``GradientTransformation`` that averages the gradients over the ranks before
the wrapped transformation sees them — the whole gradient pytree in one grouped allreduce (one callback) per step.
With ``op=hvd.Adasum`` the order turns round, as in Horovod's Adasum optimizers: the wrapped transformation makes
this rank's update from its own gradients, and the updates are combined with Adasum.

``groups=n`` splits the gradient leaves (in pytree order) into n grouped allreduces; ``groups`` as lists of leaves of
the params pytree (the arrays given to ``init``, matched by identity there) makes explicit groups, a leaf in no group
being reduced on its own (Horovod's semantics for torch and TensorFlow).

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
from hora._frontend.gradients import describe_gradients
from hora.jax.compression import Compression
from hora.jax.reductions import grouped_allreduce

#: why an optax transformation cannot run on parameter servers, and what to use instead
OPTAX_INSTEAD = (
    "an optax transformation is a pure function inside your jitted step, with no update rule a server could run "
    "and no way to fetch the servers' parameters; use strategy='allreduce' (parameter servers: hora.torch or "
    "hora.keras on the TensorFlow or torch backend)"
)

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
    groups: Any = None,
    num_groups: int = 0,
    strategy: str | None = None,
) -> optax.GradientTransformation:
    """Wrap ``optimizer`` so that ``update`` first reduces ``grads`` (a pytree) across ranks (default: average).

    Args:
        name: the collective's name (default ``DistributedOptimizer.<n>``, the n-th one this process made): a name
            that recurs every step is answered from hora's response cache.
        gradient_predivide_factor: with op=Average, divide by this before the sum and by size/this after.
        backward_passes_per_step: reduce and update every this many calls (see the module's docstring).
        average_aggregated_gradients: divide the accumulated gradients by ``backward_passes_per_step`` (Horovod's
            default, False, applies their sum).
        groups: an int (that many grouped allreduces) or lists of leaves of the params pytree (explicit groups);
            ``num_groups`` is its deprecated spelling.
        strategy: must be ``allreduce`` (default ``HORA_STRATEGY``): an optax transformation cannot run on parameter
            servers (UnsupportedError).
    """
    reduction = describe_gradients(
        "hora.jax.DistributedOptimizer",
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=groups,
        num_groups=num_groups,
        compression=compression,
        process_set=process_set,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        strategy=strategy,
        instead=OPTAX_INSTEAD,
        adasum=True,
    )
    # Adasum combines steps, not gradients (Horovod's Adasum optimizers): the wrapped transformation makes this
    # rank's update from its own gradients first, and the updates are reduced
    adasum = reduction.op is ReduceOp.ADASUM
    base = name if name is not None else f"DistributedOptimizer.{next(_instances)}"
    k = reduction.backward_passes_per_step
    param_leaves: list[Any] = []  # the leaves init saw: explicit groups name some of them

    def reduce(grads: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        explicit = reduction.groups is not None and not isinstance(reduction.groups, int)
        if explicit and len(param_leaves) != len(leaves):
            raise ValueError(
                f"hora.jax.DistributedOptimizer: groups as lists of parameters need init(params) with the params "
                f"pytree first (it has {len(param_leaves)} leaves here, the gradients {len(leaves)})"
            )
        out = list(leaves)
        parts = reduction.partition(list(range(len(leaves))), param_leaves if explicit else None)
        for g, part in enumerate(parts):
            reduced = grouped_allreduce(
                [leaves[i] for i in part],
                name=f"{base}.grads" if len(parts) == 1 else f"{base}.grads.{g}",
                compression=reduction.compression,
                op=int(reduction.op),
                prescale_factor=reduction.prescale,
                postscale_factor=reduction.postscale,
                process_set=reduction.process_set,
            )
            for i, r in zip(part, reduced):
                out[i] = r
        return jax.tree_util.tree_unflatten(treedef, out)

    def remember(params: Any) -> None:
        if reduction.groups is None or isinstance(reduction.groups, int):
            return
        leaves = jax.tree_util.tree_leaves(params)
        known = {id(x) for x in leaves}
        missing = sum(1 for g in reduction.groups for x in g if id(x) not in known)
        if missing:
            raise ValueError(
                f"hora.jax.DistributedOptimizer: {missing} array(s) in groups are not leaves of the params given to "
                "init (groups must list the very arrays of the params pytree, and init must see them, not tracers)"
            )
        param_leaves[:] = leaves

    if k == 1:

        def init_one(params: Any) -> Any:
            remember(params)
            return optimizer.init(params)

        def update_one(updates: Any, state: Any, params: Any = None) -> Any:
            if adasum:
                local, state = optimizer.update(updates, state, params)
                return reduce(local), state
            return optimizer.update(reduce(updates), state, params)

        return optax.GradientTransformation(init_one, update_one)

    def init(params: Any) -> DistributedOptimizerState:
        remember(params)
        return DistributedOptimizerState(
            jnp.zeros([], jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, params), optimizer.init(params)
        )

    def update(updates: Any, state: DistributedOptimizerState, params: Any = None) -> Any:
        acc = jax.tree_util.tree_map(jnp.add, state.grad_acc, updates)

        def apply(_: Any) -> Any:
            total = acc if adasum else reduce(acc)
            if reduction.average_aggregated_gradients:
                total = jax.tree_util.tree_map(lambda t: t / k, total)
            new_updates, inner = optimizer.update(total, state.inner_state, params)
            if adasum:
                new_updates = reduce(new_updates)
            zeros = jax.tree_util.tree_map(jnp.zeros_like, acc)
            return new_updates, DistributedOptimizerState(jnp.zeros([], jnp.int32), zeros, inner)

        def skip(_: Any) -> Any:
            zeros = jax.tree_util.tree_map(jnp.zeros_like, updates)
            return zeros, DistributedOptimizerState(state.mini_step + 1, acc, state.inner_state)

        return jax.lax.cond(state.mini_step >= k - 1, apply, skip, None)

    return optax.GradientTransformation(init, update)
