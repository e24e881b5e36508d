"""Horovod's ``horovod.keras`` value functions: collectives on values (anything ``keras.ops.convert_to_numpy``
takes; numpy arrays come back), broadcasting a model's variables, and ``load_model`` with a distributed
optimizer."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from hora import _frontend as _f
from hora._frontend import Average, global_process_set
from hora.keras.callbacks import broadcast_keras_variables
from hora.keras.optimizer import DistributedOptimizer

__all__ = [
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "load_model",
    "reducescatter",
]


def _np(value: Any) -> np.ndarray:
    return np.ascontiguousarray(keras.ops.convert_to_numpy(value))


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: int | None = None,
    compression: Any = None,
    process_set: Any = global_process_set,
) -> np.ndarray:
    """``value`` reduced over every rank (default op Average)."""
    return _f.allreduce(_np(value), average, name, op, prescale_factor, postscale_factor, process_set)


def allgather(value: Any, name: str | None = None, process_set: Any = global_process_set) -> np.ndarray:
    return _f.allgather(_np(value), name, process_set)


def broadcast(value: Any, root_rank: int, name: str | None = None, process_set: Any = global_process_set) -> np.ndarray:
    return _f.broadcast(_np(value), root_rank, name, process_set)


def reducescatter(
    value: Any, name: str | None = None, op: int = Average, process_set: Any = global_process_set
) -> np.ndarray:
    return _f.reducescatter(_np(value), op, name, process_set=process_set)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set
) -> Any:
    return _f.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    return _f.allgather_object(obj, name, process_set)


def broadcast_global_variables(root_rank: int, model: Any = None) -> None:
    """Broadcast ``model``'s variables (and its optimizer's) from ``root_rank`` now. Keras 3 has no global
    variable collection, so the model is required."""
    if model is None:
        raise ValueError("hora.keras.broadcast_global_variables needs model=: Keras 3 has no global variables")
    variables = list(model.variables)
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        variables += [v for v in opt.variables if all(v is not m for m in variables)]
    broadcast_keras_variables(variables, root_rank)


def load_model(
    filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None, compression: Any = None
) -> Any:
    """``keras.models.load_model`` whose optimizer comes back wrapped in ``DistributedOptimizer`` (its state, such
    as slots and iterations, restored)."""
    model = keras.models.load_model(filepath, custom_objects=custom_objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not hasattr(type(opt), "_hora"):
        wrapped = DistributedOptimizer(opt, compression=compression)
        if opt.built:
            wrapped.build(model.trainable_variables)
            for mine, theirs in zip(wrapped.variables, opt.variables):
                mine.assign(theirs)
        model.optimizer = wrapped
    return model
