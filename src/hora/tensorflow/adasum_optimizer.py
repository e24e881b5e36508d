"""The TF1 ``DistributedOptimizer(op=hvd.Adasum)``: Horovod's ``_DistributedAdasumOptimizer``, which combines
*model deltas*, not gradients.

``compute_gradients`` returns the wrapped optimizer's local gradients, unreduced. ``apply_gradients`` lets the
wrapped optimizer take its own step; every ``backward_passes_per_step``-th call (a communication step) then takes
each variable's ``delta = var - start``, Adasum-allreduces the deltas (one grouped op, or one per group with
``groups``), and sets ``start = start + adasum(delta)`` and ``var = start``. The other calls are plain local steps.
``start`` is the slot ``"delta_start"``, set from the variable on the first call (so a broadcast of the variables
after their initialiser, as ``BroadcastGlobalVariablesHook`` does, is honoured). The wrapped optimizer's state
(momentum, Adam's moments) stays per rank, as in Horovod.

Horovod's own class overrides ``_apply_dense`` and friends but then hands ``apply_gradients`` to the wrapped
optimizer, so its delta step never runs (horovod/horovod#1729); hora runs what that class describes. Works in
``tf.compat.v1`` graphs (Session), inside ``tf.function`` and eagerly.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._dtypes import ReduceOp
from hora._frontend.gradients import GradientReduction
from hora.tensorflow.reductions import grouped_allreduce

__all__ = ["DistributedAdasumOptimizer"]

_SLOT = "delta_start"


class DistributedAdasumOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a ``tf.compat.v1.train.Optimizer``; made by ``hora.tensorflow.DistributedOptimizer(op=hvd.Adasum)``."""

    def __init__(self, optimizer: Any, name: str | None, use_locking: bool, reduction: GradientReduction) -> None:
        if reduction.op is not ReduceOp.ADASUM:
            raise ValueError(f"DistributedAdasumOptimizer reduces with Adasum, not {reduction.op.name.title()}")
        super().__init__(name=name or f"DistributedDelta{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reduction = reduction

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, local to this rank (Adasum combines the steps they lead to)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: str | None = None) -> Any:
        """The wrapped optimizer's local step; on a communication step, every variable then moves to
        ``start + adasum(var - start)``. Returns the op that does it all (None eagerly)."""
        pairs = list(grads_and_vars)
        variables = [v for g, v in pairs if g is not None]
        if not variables:  # the wrapped optimizer's error
            return self._optimizer.apply_gradients(pairs, global_step=global_step, name=name)
        with tf.init_scope():  # created once, outside any tf.function's graph
            starts = [self._zeros_slot(v, _SLOT, self._name) for v in variables]
            counter = self._create_non_slot_variable(
                initial_value=tf.constant(0, tf.int64), name="step_count", colocate_with=variables[0]
            )
        passes = self._reduction.backward_passes_per_step
        with tf.name_scope(self._name):
            step = counter.read_value()
            first = tf.equal(step, 0)
            communicate = tf.equal(step % passes, passes - 1)
            started = tf.cond(first, lambda: _group([s.assign(v) for s, v in zip(starts, variables)]), tf.no_op)
            with tf.control_dependencies(_ops([started])):
                local = self._optimizer.apply_gradients(pairs, global_step=global_step, name=name)
            with tf.control_dependencies(_ops([local])):
                synced = tf.cond(communicate, lambda: self._combine(variables, starts), tf.no_op)
            with tf.control_dependencies(_ops([synced])):
                counted = counter.assign_add(1)
            return None if tf.executing_eagerly() else _group([counted])

    def _combine(self, variables: list[Any], starts: list[Any]) -> Any:
        """``start += adasum(var - start); var = start`` for every variable, the deltas in one grouped op."""
        r = self._reduction
        deltas = [v.read_value() - s.read_value() for v, s in zip(variables, starts)]
        moved = []
        for part in r.partition(list(range(len(variables))), variables):
            reduced = grouped_allreduce(
                [deltas[i] for i in part], compression=r.compression, op=int(ReduceOp.ADASUM), process_set=r.process_set
            )
            for i, d in zip(part, reduced):
                new_start = starts[i].assign_add(d, use_locking=self._use_locking, read_value=True)
                moved.append(variables[i].assign(new_start, use_locking=self._use_locking, read_value=False))
        return _group(moved)

    def get_slot(self, var: Any, name: str) -> Any:
        """This wrapper's ``"delta_start"`` slot, or the wrapped optimizer's slot ``name``."""
        own = super().get_slot(var, name)
        return own if own is not None else self._optimizer.get_slot(var, name)

    def get_slot_names(self) -> list[str]:
        return list(super().get_slot_names()) + list(self._optimizer.get_slot_names())

    def variables(self) -> list[Any]:
        """The wrapped optimizer's variables and this wrapper's (the ``"delta_start"`` slots and the step count),
        so that ``tf.compat.v1.variables_initializer(opt.variables())`` initialises everything the step reads.
        (Horovod's lists the wrapped optimizer's only.)"""
        return list(self._optimizer.variables()) + list(super().variables())


def _ops(items: list[Any]) -> list[Any]:
    """The graph ops among ``items`` (eagerly, ops come back as None: nothing to wait for)."""
    return [x for x in items if x is not None]


def _group(items: list[Any]) -> Any:
    return tf.group(*_ops(items))
