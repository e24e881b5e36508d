"""The TF1 ``DistributedOptimizer``: a ``tf.compat.v1.train.Optimizer`` whose ``compute_gradients`` returns
gradients averaged over every rank, in one grouped op (Horovod's ``horovod/tensorflow/__init__.py``); with
``op=hvd.Adasum``, Horovod's delta optimizer (:mod:`hora.tensorflow.adasum_optimizer`). Keras optimizers are wrapped
by ``hora.tensorflow.keras.DistributedOptimizer`` / ``hora.keras.DistributedOptimizer``."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.gradients import describe_gradients
from hora.tensorflow.adasum_optimizer import DistributedAdasumOptimizer
from hora.tensorflow.compression import Compression
from hora.tensorflow.gradients import GradientReducer

__all__ = ["DistributedOptimizer"]


class _LocalAggregation:
    """Horovod's ``LocalGradientAggregationHelper`` for TF1 graphs: ``backward_passes_per_step`` = k runs add their
    gradients into local accumulators, and every k-th run allreduces the sums (divided by k when
    ``average_aggregated_gradients``); ``apply_gradients`` applies them on that run only and otherwise just
    increments the global step, so it keeps counting runs. The counter and the accumulators are
    ``LOCAL_VARIABLES`` (run ``tf.compat.v1.local_variables_initializer()``, as ``MonitoredTrainingSession`` does)."""

    def __init__(self, passes: int, average: bool) -> None:
        self.passes, self.average = passes, average
        self.counter: Any = None
        self.sums: dict[str, Any] = {}

    def _local(self, name: str, like: Any, dtype: Any) -> Any:
        return tf.compat.v1.get_variable(
            name,
            shape=like.shape,
            dtype=dtype,
            initializer=tf.compat.v1.zeros_initializer(),
            trainable=False,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            use_resource=True,
        )

    def compute(self, grads: list[Any], variables: list[Any], reduce: Any) -> list[Any]:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        with tf.compat.v1.variable_scope("hora_aggregation", reuse=tf.compat.v1.AUTO_REUSE):
            if self.counter is None:
                self.counter = tf.compat.v1.get_variable(
                    "counter",
                    shape=(),
                    dtype=tf.int32,
                    initializer=tf.compat.v1.zeros_initializer(),
                    trainable=False,
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                    use_resource=True,
                )
            sums = []
            for i in present:
                key = variables[i].name.replace(":", "_")
                if key not in self.sums:
                    self.sums[key] = self._local(key, variables[i], grads[i].dtype)
                sums.append(self.sums[key])
        clear = tf.cond(
            tf.equal(self.counter, 0), lambda: tf.group(*[a.assign(tf.zeros_like(a)) for a in sums]), tf.no_op
        )
        with tf.control_dependencies([clear]):
            added = tf.group(*[a.assign_add(grads[i]) for a, i in zip(sums, present)])
        with tf.control_dependencies([added]):
            counted = self.counter.assign_add(1)

        def reduced() -> list[Any]:
            totals = reduce([a.read_value() for a in sums], [variables[i] for i in present])
            with tf.control_dependencies([t.op for t in totals]):
                reset = self.counter.assign(0)
            with tf.control_dependencies([reset]):
                return [t / self.passes if self.average else tf.identity(t) for t in totals]

        with tf.control_dependencies([counted]):
            local = [tf.identity(grads[i]) for i in present]
            out = tf.cond(tf.equal(counted, self.passes), reduced, lambda: local) if present else []
        result: list[Any] = [None] * len(grads)
        for j, i in enumerate(present):
            result[i] = out[j]
        return result

    def apply(self, grads_and_vars: list[tuple[Any, Any]], apply: Any) -> Any:
        def skip() -> Any:  # no update this run: the global step still counts it
            step = tf.compat.v1.train.get_global_step()
            return tf.no_op() if step is None else tf.group(step.assign_add(tf.ones([], step.dtype)))

        with tf.control_dependencies([g for g, _ in grads_and_vars if g is not None]):
            return tf.cond(tf.equal(self.counter, 0), lambda: tf.group(apply()), skip)


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    def __init__(
        self,
        optimizer: Any,
        name: str | None,
        use_locking: bool,
        reducer: GradientReducer,
        aggregation: _LocalAggregation | None = None,
    ) -> None:
        self._optimizer = optimizer
        self._reducer = reducer
        self._aggregation = aggregation
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, reduced across ranks (one grouped op); with
        ``backward_passes_per_step`` > 1, summed locally over that many runs first."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._aggregation is not None:
            if tf.executing_eagerly():
                raise NotImplementedError(
                    "backward_passes_per_step > 1 with the TF1 DistributedOptimizer works in graphs (a "
                    "tf.compat.v1 Session or a tf.function); eagerly, accumulate with a tape "
                    "(hvd.DistributedGradientTape) or use the Keras DistributedOptimizer"
                )
            return list(zip(self._aggregation.compute(grads, variables, self._reducer.reduce), variables))
        return list(zip(self._reducer.reduce(grads, variables), variables))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        if self._aggregation is not None:
            return self._aggregation.apply(list(args[0]), lambda: self._optimizer.apply_gradients(*args, **kwargs))
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: int = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
    strategy: str | None = None,
) -> Any:
    """Wrap a ``tf.compat.v1.train.Optimizer`` so that its gradients are averaged over every rank before they are
    applied. For Keras optimizers use ``hora.tensorflow.keras.DistributedOptimizer`` (or ``hora.keras``).
    ``strategy`` (default ``HORA_STRATEGY``) must be ``allreduce``: parameter servers take Keras 3 optimizers.

    ``op=hvd.Adasum`` makes Horovod's delta optimizer instead: local gradients, the wrapped optimizer's own step,
    and every ``backward_passes_per_step``-th step the variables' deltas since the last combination Adasum-reduced
    (:mod:`hora.tensorflow.adasum_optimizer`); ``average_aggregated_gradients=True`` is Horovod's ValueError then,
    a non-global process set its NotImplementedError (an UnsupportedError)."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(
            f"hora.tensorflow.DistributedOptimizer wraps a tf.compat.v1.train.Optimizer, got "
            f"{type(optimizer).__name__}; for a Keras optimizer use hora.tensorflow.keras.DistributedOptimizer "
            "(Keras 3: hora.keras.DistributedOptimizer)"
        )
    reduction = describe_gradients(
        "hora.tensorflow.DistributedOptimizer",
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=groups,
        num_groups=num_groups,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        process_set=process_set,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        strategy=strategy,
        instead="the servers run Keras 3 optimizers' rules: use hora.keras.DistributedOptimizer(keras_optimizer, "
        "strategy='parameter_server'), or strategy='allreduce'",
        adasum=True,  # Horovod's _DistributedAdasumOptimizer: the steps are combined, not the gradients
    )
    if reduction.op is ReduceOp.ADASUM:  # on one rank too, as Horovod's (the combination is then the local step)
        return DistributedAdasumOptimizer(optimizer, name, use_locking, reduction)
    reducer = GradientReducer(reduction)
    aggregation = (
        _LocalAggregation(reduction.backward_passes_per_step, reduction.average_aggregated_gradients)
        if reduction.backward_passes_per_step > 1
        else None
    )
    return _DistributedOptimizer(optimizer, name, use_locking, reducer, aggregation)
