"""Horovod's Keras callbacks (``horovod/keras/callbacks.py``), for Keras 3 on any backend: they move values with
hora's numpy collectives, so they need no framework op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from hora import _frontend as _f
from hora._frontend import Average, global_process_set
from hora._frontend.elastic_variables import broadcast_variable_values

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "broadcast_keras_variables",
    "callback_classes",
]


def broadcast_keras_variables(variables: list[Any], root_rank: int, process_set: Any = global_process_set) -> None:
    """Give every variable ``root_rank``'s value: one group of broadcasts, then one assign each."""
    broadcast_variable_values(variables, root_rank, process_set, name="hora.keras.bcast")


class _Mixin:
    """What a mixin uses of the Keras callback it is mixed into."""

    model: Any
    params: Any


class BroadcastGlobalVariablesCallbackMixin(_Mixin):
    """At the start of training, broadcast the model's variables and the optimizer's (built first if it is not
    yet, so its slots exist) from ``root_rank``: every rank starts from the same state. ``local_variables`` (a
    variable or a collection of them; Horovod's argument) are the model's variables that stay as each rank has
    them; more can be added with ``register_local_var``."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_vars: set[int] = set()
        if local_variables is None:
            local_variables = []
        elif _is_variable(local_variables):
            local_variables = [local_variables]
        else:
            local_variables = list(local_variables)
            bad = [type(v).__name__ for v in local_variables if not _is_variable(v)]
            if bad:
                raise ValueError(
                    f"All local variables must be variables (tf.Variable or keras.Variable); got {', '.join(bad)}"
                )
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Leave ``var`` out of the broadcast (each rank keeps its own value)."""
        self._local_vars.add(id(var))

    def on_train_begin(self, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        model = self.model
        opt = getattr(model, "optimizer", None)
        variables = [v for v in model.variables if id(v) not in self._local_vars]
        if opt is not None:
            if hasattr(opt, "built") and not opt.built and hasattr(opt, "build"):
                opt.build(model.trainable_variables)
            variables += [v for v in opt.variables if all(v is not m for m in variables)]
        broadcast_keras_variables(variables, self.root_rank)
        self.broadcast_done = True


def _is_variable(v: Any) -> bool:
    """A Keras 3 variable, or a TensorFlow one (what tf_keras models hold)."""
    if isinstance(v, keras.Variable):
        return True
    try:
        import tensorflow as tf
    except ImportError:
        return False
    return isinstance(v, tf.Variable)


class MetricAverageCallbackMixin(_Mixin):
    """At the end of each epoch, replace every metric in ``logs`` by its average over the ranks (so rank 0 logs and
    checkpoints on the metrics of the whole data)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], np.float64)
        averaged = _f.allreduce(values, op=Average, name=f"hora.keras.metrics.{epoch}")
        for k, v in zip(keys, averaged.tolist()):
            logs[k] = v


def _set_lr(optimizer: Any, value: float) -> None:
    lr = optimizer.learning_rate
    if hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value


def _get_lr(optimizer: Any) -> float:
    lr = optimizer.learning_rate
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


class LearningRateScheduleCallbackMixin(_Mixin):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` for ``start_epoch <= epoch < end_epoch``
    (``multiplier`` a number or a function of the epoch). ``staircase=False`` updates it every batch with the
    fractional epoch. ``momentum_correction`` is accepted for Horovod's signature (Keras 3 optimizers keep no
    momentum scaled by the learning rate)."""

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.current_epoch = 0

    def _active(self, epoch: int) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_train_begin(self, logs: Any = None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.staircase or not self._active(self.current_epoch):
            return
        if not self.steps_per_epoch:
            raise ValueError("LearningRateScheduleCallback(staircase=False) needs steps_per_epoch")
        epoch = self.current_epoch + batch / self.steps_per_epoch
        _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    on_train_batch_begin = on_batch_begin

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallbackMixin(LearningRateScheduleCallbackMixin):
    """Horovod's warm-up: over ``warmup_epochs`` the learning rate grows gradually from ``initial_lr / size`` to
    ``initial_lr`` (the rate already scaled by the number of ranks), as in "Accurate, Large Minibatch SGD"."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            epoch += 1.0 / (self.steps_per_epoch or 1)
            n = _f.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, 0, warmup_epochs, False, momentum_correction, steps_per_epoch)
        self.verbose = verbose
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and _f.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {_get_lr(self.model.optimizer):g}.")


class BestModelCheckpointMixin(_Mixin):
    """``ModelCheckpoint(save_best_only=True)`` written by rank 0 only (every rank holds the same weights)."""

    def __init__(
        self,
        filepath: str,
        monitor: str = "val_loss",
        verbose: int = 0,
        mode: str = "auto",
        save_freq: Any = "epoch",
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            filepath, monitor=monitor, verbose=verbose, save_best_only=True, mode=mode, save_freq=save_freq
        )

    def _save_model(self, *args: Any, **kwargs: Any) -> None:
        if _f.rank() == 0:
            super()._save_model(*args, **kwargs)  # type: ignore[misc]


def callback_classes(callback: type, checkpoint: type) -> dict[str, type]:
    """The callbacks on a Keras flavour's base classes (Keras 3 here; tf_keras in hora.tensorflow.keras)."""
    made: dict[str, type] = {}
    for mixin, base in [
        (BroadcastGlobalVariablesCallbackMixin, callback),
        (MetricAverageCallbackMixin, callback),
        (LearningRateScheduleCallbackMixin, callback),
        (LearningRateWarmupCallbackMixin, callback),
        (BestModelCheckpointMixin, checkpoint),
    ]:
        name = mixin.__name__.removesuffix("Mixin")
        made[name] = type(name, (mixin, base), {"__module__": __name__, "__doc__": mixin.__doc__})
    return made


class BroadcastGlobalVariablesCallback(BroadcastGlobalVariablesCallbackMixin, keras.callbacks.Callback):
    __doc__ = BroadcastGlobalVariablesCallbackMixin.__doc__


class MetricAverageCallback(MetricAverageCallbackMixin, keras.callbacks.Callback):
    __doc__ = MetricAverageCallbackMixin.__doc__


class LearningRateScheduleCallback(LearningRateScheduleCallbackMixin, keras.callbacks.Callback):
    __doc__ = LearningRateScheduleCallbackMixin.__doc__


class LearningRateWarmupCallback(LearningRateWarmupCallbackMixin, keras.callbacks.Callback):
    __doc__ = LearningRateWarmupCallbackMixin.__doc__


class BestModelCheckpoint(BestModelCheckpointMixin, keras.callbacks.ModelCheckpoint):
    __doc__ = BestModelCheckpointMixin.__doc__
