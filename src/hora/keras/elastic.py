"""``hora.keras.elastic`` (Horovod's ``horovod.keras.elastic``): ``run``, ``KerasState`` and the callbacks that keep
an elastic state current during ``model.fit`` — ``CommitStateCallback(state, batches_per_commit=1)``,
``UpdateBatchStateCallback(state)``, ``UpdateEpochStateCallback(state)`` — for Keras 3 on any backend.
:mod:`hora.tensorflow.keras.elastic` makes the same callbacks on ``tf.keras``' base class (tf_keras when
``TF_USE_LEGACY_KERAS=1``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import keras

from hora._frontend.elastic import ObjectState, State, reset, run_fn
from hora._frontend.elastic_variables import VariablesState, optimizer_variables

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "ObjectState",
    "State",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "elastic_callback_classes",
    "run",
]

F = TypeVar("F", bound=Callable[..., Any])


def run(func: F) -> F:
    """Horovod's ``hvd.elastic.run`` (see :func:`hora._frontend.elastic.run`); on the TensorFlow backend a failed
    collective inside a ``tf.function`` is turned back into ``HorovodInternalError`` as in
    :func:`hora.tensorflow.elastic.run`."""
    if "tensorflow" in sys.modules:
        from hora.tensorflow.elastic import run as tf_run

        return tf_run(func)
    return run_fn(func, reset)


class KerasState(VariablesState):
    """A Keras model and its optimizer (default ``model.optimizer``), plus plain attributes."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        super().__init__(self._model_variables, **kwargs)

    def _model_variables(self) -> list[Any]:
        return list(self.model.variables) + optimizer_variables(self.optimizer, list(self.model.trainable_variables))


class _CommitState:
    """Commit the state every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Any = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.commit()


class _UpdateBatchState:
    """Keep ``state.batch`` at the last finished batch (0 after an epoch); with ``steps_per_epoch``, shorten the
    first epoch after a reset by the batches already done."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        params = self.params  # type: ignore[attr-defined]
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params.get("steps")
            params["steps"] = self.steps_per_epoch - self.state.batch  # type: ignore[attr-defined]

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0  # type: ignore[attr-defined]


class _UpdateEpochState:
    """Keep ``state.epoch`` at the number of epochs done across resets (Keras counts from 0 in every ``fit``)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch  # type: ignore[attr-defined]

    def on_train_begin(self, logs: Any = None) -> None:
        self.initial_epoch = self.state.epoch  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1  # type: ignore[attr-defined]


def elastic_callback_classes(base: type) -> dict[str, type]:
    """The three elastic callbacks on the Keras callback class ``base`` (Keras 3's, or tf_keras')."""
    return {
        "CommitStateCallback": type("CommitStateCallback", (_CommitState, base), {"__module__": __name__}),
        "UpdateBatchStateCallback": type(
            "UpdateBatchStateCallback", (_UpdateBatchState, base), {"__module__": __name__}
        ),
        "UpdateEpochStateCallback": type(
            "UpdateEpochStateCallback", (_UpdateEpochState, base), {"__module__": __name__}
        ),
    }


_made = elastic_callback_classes(keras.callbacks.Callback)
CommitStateCallback = _made["CommitStateCallback"]
UpdateBatchStateCallback = _made["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _made["UpdateEpochStateCallback"]
