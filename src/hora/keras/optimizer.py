"""``DistributedOptimizer`` for Keras 3 (any backend with a host-callback path: TensorFlow, torch and JAX) and for
tf_keras (``TF_USE_LEGACY_KERAS=1``).

The wrapper is a subclass of the wrapped optimizer's own class with the same name and module, made from its
config: ``get_config``/``from_config`` round-trip and a saved model reloads without hora. Keras 3 reduces in
``apply`` (what ``fit`` and ``apply_gradients`` call), before clipping, as Horovod reduces before the wrapped
optimizer sees the gradients; tf_keras in ``apply_gradients``. With gradient accumulation (Keras 3's
``gradient_accumulation_steps``, or ``backward_passes_per_step`` here, which sets it) the reduction moves into the
update step, so it runs once per accumulated step and never twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set

__all__ = ["DistributedOptimizer", "distributed_class", "reduce_gradients"]


@dataclass
class _Settings:
    """The reduction a wrapped optimizer does (Horovod's ``DistributedOptimizer`` arguments)."""

    compression: Any
    sparse_as_dense: bool
    gradient_predivide_factor: float
    op: int
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    groups: Any
    process_set: ProcessSet
    legacy: bool


def reduce_gradients(settings: Any, grads: list[Any], variables: list[Any] | None) -> list[Any]:
    """``grads`` averaged (``settings.op``) across ranks in one grouped op, with the backend's own tensors."""
    backend = keras.backend.backend()
    if backend == "tensorflow" or settings.legacy:
        from hora.tensorflow.gradients import GradientReducer

        reducer = GradientReducer(
            settings.op, settings.compression, settings.sparse_as_dense, settings.gradient_predivide_factor,
            settings.groups, settings.process_set,
        )  # fmt: skip
        return reducer.reduce(grads, variables)
    if backend not in ("torch", "jax"):
        raise NotImplementedError(
            f"hora.keras.DistributedOptimizer does not support the {backend!r} Keras backend yet; use "
            "KERAS_BACKEND=tensorflow, torch or jax"
        )
    op, pre, post = ReduceOp(settings.op), 1.0, 1.0
    if op is ReduceOp.AVERAGE and settings.gradient_predivide_factor != 1.0:
        n = settings.process_set.size() or 1
        op, pre, post = ReduceOp.SUM, 1.0 / settings.gradient_predivide_factor, settings.gradient_predivide_factor / n
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced: list[Any]
    if backend == "torch":
        import hora.torch as hvd_torch

        reduced = hvd_torch.grouped_allreduce(
            [grads[i].detach() for i in present], op=int(op), prescale_factor=pre, postscale_factor=post,
            process_set=settings.process_set,
        )  # fmt: skip
    else:  # jax: Keras traces the train step under jax.jit; hora.jax makes the reduction one ordered callback
        import hora.jax as hvd_jax

        reduced = hvd_jax.grouped_allreduce(
            [grads[i] for i in present], op=int(op), prescale_factor=pre, postscale_factor=post,
            process_set=settings.process_set,
        )  # fmt: skip
    out = list(grads)
    for i, r in zip(present, reduced):
        out[i] = r
    return out


class _Keras3Mixin:
    """Methods mixed into the wrapped Keras 3 optimizer's class."""

    _hora: _Settings

    def _hora_accumulating(self) -> bool:
        return bool(getattr(self, "gradient_accumulation_steps", None))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if not self._hora_accumulating():
            variables = None if trainable_variables is None else list(trainable_variables)
            grads = reduce_gradients(self._hora, grads, variables)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _backend_update_step(self, grads: Any, trainable_variables: Any, learning_rate: Any) -> Any:
        if self._hora_accumulating():  # the accumulated (averaged) gradients, once per update step
            grads = reduce_gradients(self._hora, list(grads), list(trainable_variables))
            if not self._hora.average_aggregated_gradients:  # Horovod's default: the sum of the passes
                steps = self.gradient_accumulation_steps  # type: ignore[attr-defined]
                grads = [g if g is None else g * steps for g in grads]
        return super()._backend_update_step(grads, trainable_variables, learning_rate)  # type: ignore[misc]


class _LegacyMixin:
    """Methods mixed into a tf_keras (Keras 2) optimizer's class."""

    _hora: _Settings

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads = reduce_gradients(self._hora, [g for g, _ in pairs], [v for _, v in pairs])
        return super().apply_gradients(list(zip(grads, [v for _, v in pairs])), *args, **kwargs)  # type: ignore[misc]


def _is_legacy(cls: type) -> bool:
    return cls.__module__.startswith("tf_keras") or cls.__module__.startswith("keras.optimizers.legacy")


def distributed_class(base: type, settings: _Settings) -> type:
    """A subclass of ``base`` (same name and module) that reduces gradients with ``settings``."""
    mixin = _LegacyMixin if settings.legacy else _Keras3Mixin
    cls = type(base.__name__, (mixin, base), {"_hora": settings})
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    return cls


def make_settings(
    compression: Any, sparse_as_dense: bool, gradient_predivide_factor: float, op: int,
    backward_passes_per_step: int, average_aggregated_gradients: bool, groups: Any, process_set: ProcessSet,
    legacy: bool,
) -> _Settings:  # fmt: skip
    if gradient_predivide_factor != 1.0 and op != ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor needs op=Average (it splits the averaging around the sum)")
    if op == ReduceOp.ADASUM:
        raise NotImplementedError("op=Adasum is not supported by hora yet; use Average or Sum")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    return _Settings(
        compression=compression, sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor,
        op=op, backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups, process_set=process_set,
        legacy=legacy,
    )  # fmt: skip


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
    allreduces the rest (TensorFlow backend); see docs/ps.md."""
    from hora._strategy import resolve_strategy

    strategy = resolve_strategy(strategy, staleness=staleness, consistency=consistency, ps_parameters=ps_parameters)
    if strategy != "allreduce" and _is_legacy(type(optimizer)):
        raise NotImplementedError(f"strategy={strategy!r} needs a Keras 3 optimizer; tf_keras ones are not supported")
    if strategy == "parameter_server":
        from hora.keras.ps_optimizer import make_ps_optimizer

        return make_ps_optimizer(optimizer, name, staleness, consistency)
    if compression is None:
        from hora.keras.compression import Compression

        compression = Compression.none
    base = type(optimizer)
    legacy = _is_legacy(base)
    settings = make_settings(
        compression, sparse_as_dense, gradient_predivide_factor, op, backward_passes_per_step,
        average_aggregated_gradients, groups if groups is not None else num_groups, process_set, legacy,
    )  # fmt: skip
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
    elif legacy and backward_passes_per_step > 1:
        raise NotImplementedError("backward_passes_per_step > 1 is not supported with tf_keras optimizers in hora")
    if strategy == "hybrid":
        from hora.keras.hybrid import make_hybrid_optimizer

        return make_hybrid_optimizer(optimizer, config, settings, ps_parameters, staleness, consistency)
    cls: Any = distributed_class(base, settings)
    return cls.from_config(config)
