"""``hora.tensorflow.elastic`` (Horovod's ``horovod.tensorflow.elastic``): ``run``, ``TensorFlowKerasState`` and
``TensorFlowState``; the loop, ``State`` and ``ObjectState`` are the shared ones (:mod:`hora._frontend.elastic`),
the variable bookkeeping too (:mod:`hora._frontend.elastic_variables`).

Inside a ``tf.function`` (or a v1 graph) a failed collective reaches the script as ``tf.errors.UnknownError``
carrying hora's message; ``run`` turns it back into :class:`~hora.errors.HorovodInternalError`, as Horovod's does
for its ops' errors. Differences from Horovod (docs/elastic.md): Keras 3 optimizers are built at construction (their
slots would otherwise be missing from the first save), and ``TensorFlowState`` syncs its variables eagerly too
(Horovod's broadcasts them only through a v1 session, so under TF 2 a new worker kept its own values).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from hora._frontend.elastic import ObjectState, State, reset, run_fn
from hora._frontend.elastic_variables import VariablesState, optimizer_variables
from hora._frontend.objects import broadcast_object
from hora._runtime.context import rank
from hora.errors import HorovodInternalError
from hora.tensorflow.functions import broadcast_variables

__all__ = ["ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "run"]

F = TypeVar("F", bound=Callable[..., Any])

#: hora's collective failures, as their names appear in the message of a ``tf.errors.UnknownError``.
_FAILURES = (
    "HorovodInternalError",
    "PeerLostError",
    "CollectiveTimeoutError",
    "ShutdownError",
    "StallError",
    "CollectiveError",
)


def _surface_failures(func: F) -> F:
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as exc:
            if any(name in (exc.message or "") for name in _FAILURES):
                raise HorovodInternalError(exc.message) from exc
            raise

    return wrapper  # type: ignore[return-value]


def run(func: F) -> F:
    """Horovod's ``hvd.elastic.run`` for TensorFlow (see :func:`hora._frontend.elastic.run`)."""
    return run_fn(_surface_failures(func), reset)


def _model_built(model: Any) -> bool:
    return bool(model.built) if hasattr(model, "build") else True


class TensorFlowKerasState(VariablesState):
    """A TensorFlow Keras model and its optimizer (``tf.keras``: Keras 3, or tf_keras), plus plain attributes.

    Args:
        model: the Keras model (built).
        optimizer: its optimizer, default ``model.optimizer``.
        backend: Horovod's argument for TF 1 sessions; kept for compatibility, unused (hora runs TF 2).
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        if not _model_built(model):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        super().__init__(self._model_variables, **kwargs)

    def _model_variables(self) -> list[Any]:
        variables = list(self.model.variables)
        return variables + optimizer_variables(self.optimizer, list(self.model.trainable_variables))


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` (default: the v1 global variables), plus plain attributes. Eagerly the variables are
    read, assigned and broadcast directly; with a v1 ``session`` through it, as in Horovod."""

    def __init__(self, variables: list[Any] | None = None, session: Any = None, **kwargs: Any) -> None:
        self.variables = list(variables) if variables is not None else tf.compat.v1.global_variables()
        self.session = session
        self._bcast_op = None if session is None else broadcast_variables(self.variables, root_rank=0)
        self._values = self._read()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _read(self) -> list[Any]:
        if self.session is not None:
            return [v.eval(self.session) for v in self.variables]
        return [v.numpy().copy() for v in self.variables]

    def save(self) -> None:
        self._values = self._read()
        super().save()

    def restore(self) -> None:
        for v, value in zip(self.variables, self._values, strict=True):
            if self.session is not None:
                v.load(value, self.session)
            else:
                v.assign(value)
        super().restore()

    def sync(self) -> None:
        if self.session is not None:
            self.session.run(self._bcast_op)
        else:
            broadcast_variables(self.variables, root_rank=0)
        self._values = self._read()
        super().sync()
