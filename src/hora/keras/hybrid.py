"""``hora.keras.DistributedOptimizer(..., strategy="hybrid", ps_parameters=model)``: the tables of the model's
``keras.layers.Embedding`` layers live on the parameter servers, every other variable is averaged by allreduce and
updated by the wrapped optimizer on each worker (TensorFlow backend).

An embedding's gradient is an ``IndexedSlices``: its rows are pushed (``push_rows``), the ids every worker touched
are allgathered, and those rows are pulled back and scattered into the worker's table (see :mod:`hora._strategy`),
all in one host callback per table inside ``fit``'s ``tf.function``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from hora._strategy import check_mode, exchange_rows, touched_rows
from hora.errors import UnsupportedError

__all__ = ["make_hybrid_optimizer"]


@dataclass
class _HybridSettings:
    chosen: set[int]  # id() of the variables to hold on the servers (known before build)
    paths: set[str]  # or their paths
    rule: dict[str, Any]
    mode: str
    client: Any
    names: dict[int, str] = field(default_factory=dict)


def _chosen(ps_parameters: Any) -> tuple[set[int], set[str]]:
    if ps_parameters is None:
        raise ValueError(
            "strategy='hybrid' needs ps_parameters=: the model (its Embedding layers go to the servers), Embedding "
            "layers, variables or variable paths"
        )
    items = (
        [ps_parameters]
        if isinstance(ps_parameters, (str, keras.layers.Layer, keras.Variable))
        else list(ps_parameters)
    )
    ids: set[int] = set()
    paths: set[str] = set()
    for item in items:
        if isinstance(item, str):
            paths.add(item)
        elif isinstance(item, keras.Variable):
            ids.add(id(item))
        elif isinstance(item, keras.layers.Layer):
            layers = [
                x
                for x in item._flatten_layers(include_self=True, recursive=True)
                if isinstance(x, keras.layers.Embedding)
            ]
            if not layers:
                raise ValueError(
                    f"ps_parameters: {item.name} has no keras.layers.Embedding; name the variables instead"
                )
            for layer in layers:
                if not layer.built:
                    raise ValueError(
                        f"ps_parameters: {layer.name} is not built yet; build the model before wrapping"
                    )
                ids.add(id(layer.embeddings))
        else:
            raise ValueError(
                f"ps_parameters must hold layers, variables or variable paths, got {type(item).__name__}"
            )
    return ids, paths


class _HybridMixin:
    """Methods mixed into the wrapped Keras 3 optimizer's class for the hybrid strategy."""

    _hora: Any  # how the dense part is allreduced (a hora._frontend.gradients.GradientReduction)
    _hora_hybrid: _HybridSettings
    built: bool

    def build(self, variables: Any) -> None:
        super().build(variables)  # type: ignore[misc]
        import tensorflow as tf

        with tf.init_scope():
            _register(self._hora_hybrid, list(variables))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        from hora.keras.optimizer import reduce_gradients
        from hora.keras.ps_optimizer import built_variables

        grads = list(grads)
        variables = built_variables(self, trainable_variables)
        names = self._hora_hybrid.names
        held = [i for i, v in enumerate(variables) if id(v) in names]
        dense = [i for i, v in enumerate(variables) if id(v) not in names]
        for i in held:  # the same order on every rank (the exchange holds an allgather)
            self._hora_rows(names[id(variables[i])], grads[i], variables[i])
        if not dense:
            self._iterations.assign_add(1)  # type: ignore[attr-defined]
            return None
        dense_vars = [variables[i] for i in dense]
        reduced = reduce_gradients(self._hora, [grads[i] for i in dense], dense_vars)
        return super().apply(reduced, dense_vars)  # type: ignore[misc]

    def _hora_rows(self, name: str, grad: Any, variable: Any) -> None:
        import tensorflow as tf

        from hora.numpy import allgather
        from hora.tensorflow.bridge import run_op

        h = self._hora_hybrid
        dtype = np.dtype(keras.backend.standardize_dtype(variable.dtype))
        row_shape = tuple(variable.shape[1:])

        def union_of(ids: np.ndarray) -> np.ndarray:
            return np.unique(allgather(ids, name=f"hybrid.rows.{name}"))

        def call(ids: np.ndarray, values: np.ndarray) -> list[np.ndarray]:
            if ids.size == 1 and ids[0] < 0:  # a dense gradient: its nonzero rows
                ids = np.flatnonzero(np.any(values.reshape(len(values), -1) != 0, axis=1))
                values = values[ids]
            uniq, rows = touched_rows(ids, np.asarray(values, dtype))
            union, pulled = exchange_rows(h.client, name, h.mode, uniq, rows, union_of)
            return [union.astype(np.int64), np.ascontiguousarray(pulled, dtype)]

        if grad is None:
            ids_t, values_t = tf.zeros([0], tf.int64), tf.zeros([0, *row_shape], variable.dtype)
        elif isinstance(grad, tf.IndexedSlices):
            ids_t, values_t = tf.cast(grad.indices, tf.int64), grad.values
        else:
            ids_t, values_t = tf.constant([-1], tf.int64), tf.convert_to_tensor(grad)
        union, pulled = run_op(
            call,
            [ids_t, values_t],
            [tf.int64, variable.dtype],
            "hora_keras_hybrid_rows",
            shapes=[[None], [None, *row_shape]],
        )
        self.assign(variable, tf.IndexedSlices(pulled, union))  # type: ignore[attr-defined]


def _register(settings: _HybridSettings, variables: list[Any]) -> None:
    client = settings.client
    picked = [v for v in variables if id(v) in settings.chosen or v.path in settings.paths]
    unknown = settings.paths - {v.path for v in variables}
    if unknown:
        raise ValueError(f"ps_parameters names {sorted(unknown)}, which the optimizer's variables do not include")
    for v in picked:
        if id(v) in settings.names:
            continue
        a = np.array(keras.ops.convert_to_numpy(v.value))
        if a.dtype not in (np.float32, np.float64) or a.ndim < 1:
            raise UnsupportedError(f"variable '{v.path}' ({a.dtype}, shape {a.shape}) cannot live on the servers")
        name = f"keras/{v.path}"
        client.register(name, a, rule=settings.rule, consistency=settings.mode)
        settings.names[id(v)] = name
        v.assign(client.pull(name))  # every worker starts from worker 0's table


def make_hybrid_optimizer(
    optimizer: Any,
    config: dict[str, Any],
    settings: Any,
    ps_parameters: Any,
    staleness: int | None,
    consistency: str | None,
) -> Any:
    """The hybrid form of the Keras 3 ``optimizer`` (``settings``: its allreduce settings)."""
    from hora._strategy import resolve_consistency
    from hora.keras.ps_optimizer import keras_rule
    from hora.ps.discovery import shared_client

    if keras.backend.backend() != "tensorflow":
        raise UnsupportedError(
            f"strategy='hybrid' with Keras needs the TensorFlow backend (KERAS_BACKEND={keras.backend.backend()}); "
            "use strategy='parameter_server' or 'allreduce' there"
        )
    if config.get("gradient_accumulation_steps"):
        raise UnsupportedError(
            "strategy='hybrid' does not support gradient accumulation (backward_passes_per_step > 1)"
        )
    chosen, paths = _chosen(ps_parameters)
    rule = keras_rule(optimizer)
    client = shared_client()
    hybrid = _HybridSettings(
        chosen, paths, rule, check_mode(resolve_consistency(client, staleness, consistency)), client
    )
    base = type(optimizer)
    cls: Any = type(base.__name__, (_HybridMixin, base), {"_hora": settings, "_hora_hybrid": hybrid})
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    return cls.from_config(config)
