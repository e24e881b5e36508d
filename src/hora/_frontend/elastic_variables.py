"""An elastic state made of framework variables (anything with ``.numpy()`` and ``.assign(value)``: Keras 3
variables on any backend, tf_keras and ``tf.Variable``), written once for every adapter that keeps such variables:
Keras' ``KerasState``, TensorFlow's ``TensorFlowKerasState`` and ``TensorFlowState``.

``save()`` keeps a numpy copy of every variable, ``restore()`` assigns the copies back, ``sync()`` broadcasts rank
0's values (one group of in-place broadcasts, then one assign each) and saves them; keyword arguments are plain
attributes as in :class:`~hora._frontend.elastic.ObjectState`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hora._frontend.elastic import ObjectState
from hora._frontend.movement import start_broadcast
from hora._frontend.objects import broadcast_object
from hora._frontend.process_set import ProcessSet, global_process_set
from hora._runtime.context import rank

__all__ = ["VariablesState", "broadcast_variable_values", "optimizer_variables"]


def optimizer_variables(optimizer: Any, model_variables: list[Any]) -> list[Any]:
    """An optimizer's variables (Keras 3: a list; tf_keras: a method), built first if it was not (Keras 3 creates
    its slots at the first step: a state saved before it would miss them)."""
    if optimizer is None:
        return []
    if getattr(optimizer, "built", True) is False and hasattr(optimizer, "build"):
        optimizer.build(model_variables)
    found = optimizer.variables
    return list(found() if callable(found) else found)


def broadcast_variable_values(
    variables: list[Any],
    root_rank: int = 0,
    process_set: ProcessSet = global_process_set,
    name: str = "hora.elastic.variable",
) -> None:
    """Give every variable ``root_rank``'s value: one group of broadcasts (named ``name.<i>``), then one assign each.
    Works for Keras 3 variables on any backend and ``tf.Variable`` alike."""
    values = [np.ascontiguousarray(np.asarray(v.numpy())) for v in variables]
    handles = [
        start_broadcast(a, root_rank, inplace=True, name=f"{name}.{i}", process_set=process_set)
        for i, a in enumerate(values)
    ]
    for h in handles:
        h.wait()
    for v, a in zip(variables, values):
        v.assign(np.reshape(a, tuple(v.shape)))


class VariablesState(ObjectState):
    """Elastic state of the variables ``variables()`` returns, plus plain attributes (``kwargs``)."""

    def __init__(self, variables: Callable[[], list[Any]], **kwargs: Any) -> None:
        self._variables = variables
        self._saved_values = self._values()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _values(self) -> list[np.ndarray]:
        return [np.array(v.numpy()) for v in self._variables()]  # copies, never views of the variables

    def save(self) -> None:
        self._saved_values = self._values()
        super().save()

    def restore(self) -> None:
        for v, value in zip(self._variables(), self._saved_values, strict=True):
            v.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variable_values(self._variables())
        self._saved_values = self._values()
        super().sync()
