"""Broadcasting variables and Python objects (Horovod's ``horovod/tensorflow/functions.py``), and the TF1 hook that
broadcasts the global variables when a ``MonitoredTrainingSession`` starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hora import _frontend as _f
from hora._frontend import ProcessSet, global_process_set
from hora.tensorflow.bridge import executing_eagerly
from hora.tensorflow.movement import broadcast_

__all__ = [
    "BroadcastGlobalVariablesHook",
    "allgather_object",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
]


def broadcast_variables(
    variables: Any, root_rank: int, process_set: ProcessSet = global_process_set, inplace: bool = False
) -> Any:
    """Give every variable of ``variables`` ``root_rank``'s value, in one op. Eagerly this happens now; in a graph
    the returned op does it. Works for ``tf.Variable`` and Keras 3 variables alike."""
    vs = list(variables)
    if not vs:
        return None if executing_eagerly() else tf.no_op()
    result = broadcast_(vs, root_rank, process_set=process_set)
    return None if executing_eagerly() else tf.group(*result)


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1: an op that broadcasts every global variable from ``root_rank``."""
    if executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution; use "
            "hvd.broadcast_variables(<model/optimizer variables>, root_rank) instead"
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 ``SessionRunHook`` that broadcasts the global variables from ``root_rank`` once the session exists (so
    every rank starts from the same weights, random initialisation or checkpoint)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op: Any = None

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send a picklable object from ``root_rank`` to every rank; returns it everywhere (runs now, in Python)."""
    return _f.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(
    root_rank: int = 0, session: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Callable[[Any], Any]:
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod's form for repeated use)."""
    return lambda obj: _f.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(
    obj: Any, session: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Gather a picklable object from every rank; returns the list in rank order."""
    return _f.allgather_object(obj, name, process_set)
