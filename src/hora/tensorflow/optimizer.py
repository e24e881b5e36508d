"""The TF1 ``DistributedOptimizer``: a ``tf.compat.v1.train.Optimizer`` whose ``compute_gradients`` returns
gradients averaged over every rank, in one grouped op (Horovod's ``horovod/tensorflow/__init__.py``). Keras
optimizers are wrapped by ``hora.tensorflow.keras.DistributedOptimizer`` / ``hora.keras.DistributedOptimizer``."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora.errors import UnsupportedError
from hora.tensorflow.compression import Compression
from hora.tensorflow.gradients import GradientReducer

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    def __init__(self, optimizer: Any, name: str | None, use_locking: bool, reducer: GradientReducer) -> None:
        self._optimizer = optimizer
        self._reducer = reducer
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, reduced across ranks (one grouped op)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        return list(zip(self._reducer.reduce(grads, variables), variables))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: int = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Wrap a ``tf.compat.v1.train.Optimizer`` so that its gradients are averaged over every rank before they are
    applied. For Keras optimizers use ``hora.tensorflow.keras.DistributedOptimizer`` (or ``hora.keras``)."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(
            f"hora.tensorflow.DistributedOptimizer wraps a tf.compat.v1.train.Optimizer, got "
            f"{type(optimizer).__name__}; for a Keras optimizer use hora.tensorflow.keras.DistributedOptimizer "
            "(Keras 3: hora.keras.DistributedOptimizer)"
        )
    if backward_passes_per_step != 1:
        raise UnsupportedError(
            "backward_passes_per_step > 1 is not supported by the TF1 DistributedOptimizer in hora; accumulate "
            "gradients yourself or use the Keras DistributedOptimizer, which supports it"
        )
    reducer = GradientReducer(
        op, compression, sparse_as_dense, gradient_predivide_factor, groups if groups is not None else num_groups,
        process_set,
    )  # fmt: skip
    return _DistributedOptimizer(optimizer, name, use_locking, reducer)
