"""Broadcasting a pytree of parameters (or an optax state) and Python objects."""

from __future__ import annotations

from typing import Any

import jax

from hora import _frontend as _f
from hora._frontend import ProcessSet, global_process_set
from hora.jax.movement import grouped_broadcast
from hora.jax.reductions import _as_arrays

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]


def broadcast_parameters(
    params: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """``params`` (any pytree of arrays: a dict of weights, a Flax variable dict, an optax state) with
    ``root_rank``'s values, in one grouped broadcast. JAX arrays are immutable, so the result is a new pytree of the
    same structure (every leaf a JAX array); call it on every rank and keep what it returns."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    out = grouped_broadcast(_as_arrays(leaves), root_rank, name, process_set)
    return jax.tree_util.tree_unflatten(treedef, out)


def broadcast_optimizer_state(
    opt_state: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """An optax state is a pytree: :func:`broadcast_parameters` of it (Horovod's name, for symmetry with torch)."""
    return broadcast_parameters(opt_state, root_rank, name, process_set)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Send a picklable object from ``root_rank`` to every rank; returns it everywhere (eager only)."""
    jax.effects_barrier()
    return _f.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Gather a picklable object from every rank; returns the list in rank order (eager only)."""
    jax.effects_barrier()
    return _f.allgather_object(obj, name, process_set)
