"""``DistributedOptimizer`` for Keras 3 (any backend with a host-callback path: TensorFlow, torch and JAX) and for
tf_keras (``TF_USE_LEGACY_KERAS=1``).

The wrapper is a subclass of the wrapped optimizer's own class with the same name and module, made from its
config: ``get_config``/``from_config`` round-trip and a saved model reloads without hora. Keras 3 reduces in
``apply`` (what ``fit`` and ``apply_gradients`` call), before clipping, as Horovod reduces before the wrapped
optimizer sees the gradients; tf_keras in ``apply_gradients``. With gradient accumulation (Keras 3's
``gradient_accumulation_steps``, or ``backward_passes_per_step`` here, which sets it) the reduction moves into the
update step, so it runs once per accumulated step and never twice. tf_keras has no gradient accumulation of its
own: ``backward_passes_per_step`` there sums the gradients locally and reduces every k-th step, as Horovod's
``LocalGradientAggregationHelperEager`` does (:mod:`hora.keras.aggregation`). The reduction itself (op, predivide,
groups, compression, strategy) is one :class:`~hora._frontend.gradients.GradientReduction`.
"""

from __future__ import annotations

from typing import Any

import keras

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.gradients import GradientReduction, describe_gradients

__all__ = [
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "distributed_class",
    "is_legacy",
    "reduce_gradients",
]


def reduce_gradients(
    reduction: GradientReduction, grads: list[Any], variables: list[Any] | None, legacy: bool = False
) -> list[Any]:
    """``grads`` reduced across ranks as ``reduction`` says (one grouped op per group), with the backend's own
    tensors."""
    backend = keras.backend.backend()
    if backend == "tensorflow" or legacy:
        from hora.tensorflow.gradients import GradientReducer

        return GradientReducer(reduction).reduce(grads, variables)
    if backend not in ("torch", "jax"):
        raise NotImplementedError(
            f"hora.keras.DistributedOptimizer does not support the {backend!r} Keras backend yet; use "
            "KERAS_BACKEND=tensorflow, torch or jax"
        )
    present = [i for i, g in enumerate(grads) if g is not None]
    owners = None if variables is None else [variables[i] for i in present]
    out = list(grads)
    reduced: list[Any]
    for part in reduction.partition(present, owners):
        if backend == "torch":
            import hora.torch as hvd_torch

            reduced = hvd_torch.grouped_allreduce(
                [grads[i].detach() for i in part],
                op=int(reduction.op),
                prescale_factor=reduction.prescale,
                postscale_factor=reduction.postscale,
                process_set=reduction.process_set,
            )
        else:  # jax: Keras traces the train step under jax.jit; hora.jax makes the reduction one ordered callback
            import hora.jax as hvd_jax

            reduced = hvd_jax.grouped_allreduce(
                [grads[i] for i in part],
                op=int(reduction.op),
                prescale_factor=reduction.prescale,
                postscale_factor=reduction.postscale,
                process_set=reduction.process_set,
            )
        for i, r in zip(part, reduced):
            out[i] = r
    return out


def _divided(grad: Any, size: int) -> Any:
    if type(grad).__name__ == "IndexedSlices":  # tf.IndexedSlices: scale the values, as Horovod does
        import tensorflow as tf

        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size


class _LocalVariables:
    """``register_local_var``, shared by both mixins: the registered variables' gradients are not reduced; with
    ``scale_local_gradients`` they are divided by the process set's size (whatever ``op``), as Horovod's
    ``_DistributedOptimizer._allreduce`` does (see its pull 3695)."""

    _hora: GradientReduction
    _hora_scale_local: bool

    def register_local_var(self, var: Any) -> None:
        """Registers a variable as worker local: its gradients are not reduced across ranks (Horovod's name)."""
        # in __dict__, past Keras' and TensorFlow's attribute tracking: not optimizer state, and not saved
        self.__dict__.setdefault("_hora_local", {})[id(var)] = var

    def _hora_reduce(self, grads: list[Any], variables: list[Any] | None, legacy: bool = False) -> list[Any]:
        local = self.__dict__.get("_hora_local")
        if not local or variables is None:
            return reduce_gradients(self._hora, grads, variables, legacy)
        shared = [i for i, v in enumerate(variables) if id(v) not in local]
        reduced = reduce_gradients(
            self._hora, [grads[i] for i in shared], [variables[i] for i in shared], legacy
        )
        out = list(grads)
        for i, r in zip(shared, reduced):
            out[i] = r
        if self._hora_scale_local:
            size = self._hora.set_size()
            out = [
                g if g is None or id(v) not in local else _divided(g, size) for g, v in zip(out, variables)
            ]
        return out


class _Keras3Mixin(_LocalVariables):
    """Methods mixed into the wrapped Keras 3 optimizer's class."""

    def _hora_accumulating(self) -> bool:
        return bool(getattr(self, "gradient_accumulation_steps", None))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if not self._hora_accumulating():
            variables: list[Any] | None
            if trainable_variables is not None:
                variables = list(trainable_variables)
            else:  # Keras' own rule: the gradients match the variables the optimizer was built with
                variables = getattr(self, "_trainable_variables", None)
            grads = self._hora_reduce(grads, variables)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _backend_update_step(self, grads: Any, trainable_variables: Any, learning_rate: Any) -> Any:
        if self._hora_accumulating():  # the accumulated (averaged) gradients, once per update step
            grads = self._hora_reduce(list(grads), list(trainable_variables))
            if not self._hora.average_aggregated_gradients:  # Horovod's default: the sum of the passes
                steps = self.gradient_accumulation_steps  # type: ignore[attr-defined]
                grads = [g if g is None else g * steps for g in grads]
        return super()._backend_update_step(grads, trainable_variables, learning_rate)  # type: ignore[misc]


class _LegacyMixin(_LocalVariables):
    """Methods mixed into a tf_keras (Keras 2) optimizer's class."""

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._hora.backward_passes_per_step == 1:
            grads = self._hora_reduce(grads, variables, legacy=True)
            return super().apply_gradients(list(zip(grads, variables)), *args, **kwargs)  # type: ignore[misc]
        from hora.keras.aggregation import LocalAggregation

        agg = self.__dict__.get("_hora_aggregation")
        if agg is None:
            agg = LocalAggregation(
                self._hora.backward_passes_per_step,
                self._hora.average_aggregated_gradients,
                self._hora.sparse_as_dense,
            )
            # not tracked: Horovod's accumulators are not saved either
            self.__dict__["_hora_aggregation"] = agg
        grads = agg.compute(grads, lambda gs: self._hora_reduce(gs, variables, legacy=True))
        base_apply = super().apply_gradients  # type: ignore[misc]
        return agg.apply(lambda: base_apply(list(zip(grads, variables)), *args, **kwargs), self)


def is_legacy(cls: type) -> bool:
    """Whether ``cls`` is a tf_keras (Keras 2) optimizer class: any class in its MRO comes from tf_keras (or Keras
    2's ``keras.optimizers.legacy``), so a user's subclass of one counts too."""
    return any(
        c.__module__.startswith(("tf_keras", "keras.optimizers.legacy", "keras.src.optimizers.legacy"))
        for c in cls.__mro__
    )


def distributed_class(
    base: type, reduction: GradientReduction, legacy: bool, scale_local_gradients: bool = True
) -> type:
    """A subclass of ``base`` (same name and module) that reduces gradients as ``reduction`` says, but for the
    variables given to ``register_local_var`` (divided by the set's size with ``scale_local_gradients``)."""
    mixin = _LegacyMixin if legacy else _Keras3Mixin
    attributes = {"_hora": reduction, "_hora_scale_local": bool(scale_local_gradients)}
    cls = type(base.__name__, (mixin, base), attributes)
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    return cls


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = ReduceOp.AVERAGE,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
    strategy: str | None = None,
    staleness: int | None = None,
    consistency: str | None = None,
    ps_parameters: Any = None,
) -> Any:
    """Wrap a Keras optimizer so that the gradients it applies are averaged over every rank (one grouped op per
    step). Returns an optimizer of the same class name and config.

    hora's own: ``strategy="parameter_server"`` (default: ``HORA_STRATEGY``, ``allreduce``) runs the update on the
    job's parameter servers (``hora run --num-ps S``) instead (Keras 3 on the TensorFlow or torch backend;
    ``SGD``, ``Adagrad``, ``Adam``), with ``staleness=k`` for ``bounded(k)`` or ``consistency`` (``async``,
    ``sync``, ``bounded(k)``; default ``HORA_PS_CONSISTENCY``). ``strategy="hybrid"`` keeps ``ps_parameters`` (the
    model: its ``Embedding`` tables; or layers, variables, paths) on the servers, updated row by row, and
    allreduces the rest (TensorFlow backend); see docs/ps.md. tf_keras optimizers support ``allreduce`` only.

    As in Horovod, the optimizer's ``register_local_var(var)`` keeps ``var``'s gradients local (not reduced;
    divided by the process set's size with ``scale_local_gradients``): see :func:`PartialDistributedOptimizer`.

    ``op=hvd.Adasum`` (allreduce strategy, global process set) reduces the gradients with Adasum, as
    ``DistributedGradientTape(op=hvd.Adasum)`` does; sparse gradients need ``sparse_as_dense=True`` then. Horovod's
    Keras wrappers refuse every op but Average and Sum, so this is hora's own."""
    base = type(optimizer)
    legacy = is_legacy(base)
    if compression is None:
        from hora.keras.compression import Compression

        compression = Compression.none
    reduction = describe_gradients(
        "hora.keras.DistributedOptimizer",
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
        strategies=("allreduce",) if legacy else ("allreduce", "parameter_server", "hybrid"),
        instead="the servers run Keras 3 optimizers' rules: wrap a Keras 3 optimizer (unset TF_USE_LEGACY_KERAS), "
        "or use strategy='allreduce'",
        staleness=staleness,
        consistency=consistency,
        ps_parameters=ps_parameters,
        adasum=True,  # the gradients are Adasum-reduced, as Horovod's tape and shared allreduce_grads do
    )
    if reduction.strategy == "parameter_server":
        from hora.keras.ps_optimizer import make_ps_optimizer

        return make_ps_optimizer(optimizer, name, staleness, consistency)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if not legacy and backward_passes_per_step > 1:
        steps = config.get("gradient_accumulation_steps")
        if steps not in (None, backward_passes_per_step):
            raise ValueError(
                f"backward_passes_per_step={backward_passes_per_step} and the optimizer's "
                f"gradient_accumulation_steps={steps} disagree; set one of them"
            )
        config["gradient_accumulation_steps"] = backward_passes_per_step
    if reduction.strategy == "hybrid":
        from hora.keras.hybrid import make_hybrid_optimizer

        return make_hybrid_optimizer(optimizer, config, reduction, ps_parameters, staleness, consistency)
    cls: Any = distributed_class(base, reduction, legacy, scale_local_gradients)
    return cls.from_config(config)


#: why local layers cannot run on parameter servers, and what to use instead
PARTIAL_INSTEAD = (
    "local layers keep each rank's own gradients, and a parameter server holds one copy of every variable; use "
    "hora.keras.DistributedOptimizer(opt, strategy=...) without local layers, or strategy='allreduce' (unset "
    "HORA_STRATEGY)"
)


def PartialDistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = ReduceOp.AVERAGE,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """:func:`DistributedOptimizer` whose ``local_layers`` (a Keras layer or a collection of them) keep their
    trainable weights' gradients local to each rank: not reduced, and divided by the process set's size with
    ``scale_local_gradients`` (whatever ``op``), as Horovod 0.28.1's does. Without local layers it is
    :func:`DistributedOptimizer`. Allreduce only: ``HORA_STRATEGY=parameter_server`` or ``hybrid`` is an
    UnsupportedError."""
    what = "hora.keras.PartialDistributedOptimizer"
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(
            f"{what}: op currently only supports Average and Sum; got op={op!r}. Use hvd.Average or hvd.Sum"
        )
    legacy = is_legacy(type(optimizer))
    if legacy:
        import tensorflow as tf

        layer_class: type = tf.keras.layers.Layer  # tf_keras here (TF_USE_LEGACY_KERAS=1)
        layer_name = "tf.keras.layers.Layer (tf_keras)"
    else:
        layer_class, layer_name = keras.layers.Layer, "keras.layers.Layer"
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, layer_class):
        layers = [local_layers]
    else:
        layers = list(local_layers) if isinstance(local_layers, (list, tuple, set)) else [local_layers]
        wrong = [type(layer).__name__ for layer in layers if not isinstance(layer, layer_class)]
        if wrong:
            raise ValueError(
                f"{what}: all local layers must be of {layer_name} type; got "
                f"{', '.join(wrong)}. Pass the model's layers themselves (e.g. local_layers=[model.layers[0]])"
            )
    describe_gradients(
        what,
        op=op,
        strategy=None,
        strategies=("allreduce",),
        instead=PARTIAL_INSTEAD,
        process_set=process_set,
    )
    opt = DistributedOptimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
        strategy="allreduce",
    )
    for layer in layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt
