"""``hora.keras.DistributedOptimizer(..., strategy="parameter_server")``: the Keras optimizer's update runs on the
job's parameter servers.

The optimizer is translated into a server rule (data, not code): ``SGD`` (momentum, Nesterov), ``Adagrad`` and
``Adam``. When Keras builds the optimizer (``fit`` does it before the first step) every trainable variable is
registered on the servers under ``keras/<variable path>`` (worker 0's values win) and pulled back, so every worker
starts from worker 0's weights. Each ``apply`` (what ``fit``'s train step calls) pushes every gradient and assigns
the pulled values to the variable; no update runs on the worker. In a ``tf.function`` the exchange is one host
callback (:func:`hora.tensorflow.bridge.run_op`); on the torch backend it runs eagerly. The JAX backend's train
step is a pure function and cannot talk to servers: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from hora.errors import UnsupportedError

__all__ = ["built_variables", "keras_rule", "make_ps_optimizer"]

_SUPPORTED = "SGD (momentum, Nesterov), Adagrad and Adam"


def built_variables(optimizer: Any, trainable_variables: Any) -> list[Any]:
    """The variables an ``apply`` updates (Keras's own rule: those given, else the built ones), building the
    optimizer on first use as Keras's ``apply`` does."""
    if trainable_variables is None:
        return list(optimizer._trainable_variables)
    variables = list(trainable_variables)
    if not optimizer.built:
        optimizer.build(variables)
        optimizer.built = True
    return variables


def keras_rule(optimizer: Any) -> dict[str, Any]:
    """The server rule equivalent to the Keras 3 ``optimizer``'s update; ``UnsupportedError`` naming what to change
    otherwise."""
    name = type(optimizer).__name__
    cfg = optimizer.get_config()
    lr = cfg.get("learning_rate")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise UnsupportedError(
            f"{name} has a learning-rate schedule ({lr!r}); the servers' rule takes a constant learning rate: pass a "
            "number (the servers keep it for the whole run)"
        )
    for key in (
        "weight_decay",
        "clipnorm",
        "clipvalue",
        "global_clipnorm",
        "loss_scale_factor",
        "gradient_accumulation_steps",
        "use_ema",
    ):
        if cfg.get(key):
            raise UnsupportedError(
                f"{name}({key}={cfg[key]!r}) has no parameter-server rule; leave {key} unset with "
                "strategy='parameter_server'"
            )
    o = keras.optimizers  # isinstance: on the torch backend Keras builds backend subclasses (TorchAdam, ...)
    if isinstance(optimizer, o.SGD):
        if cfg.get("momentum"):
            return {
                "rule": "momentum",
                "lr": float(lr),
                "momentum": float(cfg["momentum"]),
                "nesterov": bool(cfg.get("nesterov")),
            }
        return {"rule": "sgd", "lr": float(lr)}
    if isinstance(optimizer, o.Adagrad):
        return {
            "rule": "adagrad",
            "lr": float(lr),
            "initial_accumulator": float(cfg["initial_accumulator_value"]),
            "epsilon": float(cfg["epsilon"]),
        }
    if isinstance(optimizer, o.Adam) and not isinstance(optimizer, o.AdamW):
        if cfg.get("amsgrad"):
            raise UnsupportedError("Adam(amsgrad=True) has no parameter-server rule; use amsgrad=False")
        return {
            "rule": "adam",
            "lr": float(lr),
            "beta1": float(cfg["beta_1"]),
            "beta2": float(cfg["beta_2"]),
            "epsilon": float(cfg["epsilon"]),
        }
    raise UnsupportedError(
        f"strategy='parameter_server' runs the update on the servers, which know {_SUPPORTED}; {name} is not one "
        "of them. Use one of those, or strategy='allreduce'"
    )


@dataclass
class _PSSettings:
    rule: dict[str, Any]
    consistency: str
    client: Any = None
    names: dict[int, str] = field(default_factory=dict)


class _PSMixin:
    """Methods mixed into the wrapped Keras 3 optimizer's class for the parameter-server strategy."""

    _hora_ps: _PSSettings
    built: bool

    def build(self, variables: Any) -> None:
        super().build(variables)  # type: ignore[misc]
        _eager(lambda: _register(self._hora_ps, list(variables)))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if not grads:
            return None
        variables = built_variables(self, trainable_variables)
        settings = self._hora_ps
        missing = [v.path for v in variables if id(v) not in settings.names]
        if missing:
            raise ValueError(
                f"hora.keras DistributedOptimizer (parameter_server): variables {missing[:5]} were not "
                "in the list the optimizer was built with"
            )
        names = [settings.names[id(v)] for v in variables]
        values = _exchange(settings.client, names, grads, variables)
        for v, value in zip(variables, values):
            v.assign(value)
        self._iterations.assign_add(1)  # type: ignore[attr-defined]
        return None


def _eager(fn: Any) -> Any:
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.init_scope():
            return fn()
    return fn()


def _register(settings: _PSSettings, variables: list[Any]) -> None:
    """Register the variables (worker 0's values win) and set every worker's from the servers'."""
    if settings.client is None:
        from hora.ps.discovery import shared_client

        settings.client = shared_client()
    client = settings.client
    arrays = {}
    for v in variables:
        if id(v) in settings.names:
            continue
        if v.constraint is not None:
            raise UnsupportedError(f"variable '{v.path}' has a constraint; the servers apply no constraints")
        a = np.array(keras.ops.convert_to_numpy(v.value))
        if a.dtype not in (np.float32, np.float64):
            raise UnsupportedError(f"variable '{v.path}' is {a.dtype}; the parameter servers hold float32/float64")
        arrays[f"keras/{v.path}"] = (v, a)
    for name, (v, a) in arrays.items():
        client.register(name, a, rule=settings.rule, consistency=settings.consistency)
        settings.names[id(v)] = name
    for name, (v, a) in arrays.items():
        v.assign(client.pull(name).reshape(a.shape))


def _exchange(client: Any, names: list[str], grads: list[Any], variables: list[Any]) -> list[Any]:
    """Push every gradient and pull every variable's new values (a host callback inside a ``tf.function``)."""
    backend = keras.backend.backend()
    dtypes = [np.dtype(keras.backend.standardize_dtype(v.dtype)) for v in variables]
    shapes = [tuple(v.shape) for v in variables]

    def call(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = []
        for name, g, dt, shape in zip(names, arrays, dtypes, shapes):
            out = np.empty(shape, dt) if backend != "tensorflow" else _aligned(shape, dt)
            client.push_pull(name, np.asarray(g, dt), out=out if shape else out.reshape(1))
            outs.append(out)
        return outs

    if backend == "tensorflow":
        import tensorflow as tf

        from hora.tensorflow.bridge import run_op

        dense = []
        for g, v in zip(grads, variables):
            if g is None:  # every worker pushes every variable each step (sync counts the pushes)
                g = tf.zeros(v.shape, v.dtype)
            dense.append(tf.convert_to_tensor(g))  # IndexedSlices (embeddings) are pushed dense
        return run_op(call, dense, [v.dtype for v in variables], "hora_keras_ps_apply", shapes=shapes)
    if backend == "torch":
        arrays = [np.zeros(s, d) if g is None else g.detach().cpu().numpy() for g, s, d in zip(grads, shapes, dtypes)]
        return call(*arrays)
    raise UnsupportedError(
        f"strategy='parameter_server' is not supported on the {backend!r} Keras backend (its train step is a pure "
        "compiled function that cannot talk to the servers); use KERAS_BACKEND=tensorflow or torch"
    )


def _aligned(shape: tuple[int, ...], dt: np.dtype[Any]) -> np.ndarray:
    from hora.tensorflow.bridge import aligned_empty

    return aligned_empty(shape, dt)


def make_ps_optimizer(optimizer: Any, name: str | None, staleness: int | None, consistency: str | None) -> Any:
    """The parameter-server form of the Keras 3 ``optimizer``: same class name, module and config."""
    from hora._strategy import resolve_consistency
    from hora.ps.discovery import shared_client

    if keras.backend.backend() not in ("tensorflow", "torch"):
        raise UnsupportedError(
            f"strategy='parameter_server' is not supported on the {keras.backend.backend()!r} Keras backend; use "
            "KERAS_BACKEND=tensorflow or torch"
        )
    rule = keras_rule(optimizer)
    client = shared_client()  # here, so a job without servers fails at the wrapper, not in the first step
    settings = _PSSettings(rule, resolve_consistency(client, staleness, consistency), client)
    base = type(optimizer)
    cls: Any = type(base.__name__, (_PSMixin, base), {"_hora_ps": settings})
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)
