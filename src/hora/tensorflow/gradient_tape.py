"""``DistributedGradientTape`` and ``PartialDistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()``
returns gradients reduced across ranks, in one grouped op (Horovod's ``horovod/tensorflow/__init__.py``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.gradients import describe_gradients
from hora.tensorflow.compression import Compression
from hora.tensorflow.gradients import GradientReducer

#: why a tape cannot run on parameter servers, and what to use instead
TAPE_INSTEAD = (
    "a tape only computes gradients and the update rule is whatever your code applies next, so no server can run "
    "it; wrap the Keras optimizer instead (hora.keras.DistributedOptimizer(opt, strategy='parameter_server')) and "
    "apply the tape's local gradients with it, or use strategy='allreduce'"
)

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class _DistributedGradientTape(tf.GradientTape):
    """Mixed into the wrapped tape's own class (so ``isinstance`` and everything else keep working)."""

    _hora_reducer: GradientReducer
    _hora_local: list[Any]
    _hora_scale_local: bool

    def register_local_source(self, source: Any) -> None:
        """Gradients of ``source`` stay local to this rank (not reduced); e.g. a rank's own embedding shard."""
        self._hora_local.append(source)

    def register_local_sources(self, sources: Any) -> None:
        for s in tf.nest.flatten(sources):
            self.register_local_source(s)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads, expand_composites=False)
        local = {id(s) for s in self._hora_local}
        shared = [i for i, s in enumerate(flat_sources) if id(s) not in local]
        reduced = self._hora_reducer.reduce([flat_grads[i] for i in shared], [flat_sources[i] for i in shared])
        out = list(flat_grads)
        for i, r in zip(shared, reduced):
            out[i] = r
        if local and self._hora_scale_local:
            # Horovod divides local gradients by the set's size whatever the op (its pull/3695), and keeps a sparse
            # one sparse (only its values are divided).
            size = self._hora_reducer.reduction.set_size()
            for i, s in enumerate(flat_sources):
                if id(s) in local and out[i] is not None:
                    out[i] = _divided(out[i], size)
        return tf.nest.pack_sequence_as(grads, out)


def _divided(grad: Any, size: int) -> Any:
    """``grad / size``; an ``IndexedSlices`` stays one (its values divided)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(size, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(size, grad.dtype)


def DistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: int = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
    strategy: str | None = None,
) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` averages (``op``) the gradients over every rank, as one grouped op
    (``groups``/``num_groups``: several). The wrapper shares the tape's recording, so it can wrap a tape after its
    ``with`` block, as in Horovod's examples. ``strategy`` (default ``HORA_STRATEGY``) must be ``allreduce``: a
    tape has no update rule a parameter server could run (UnsupportedError saying what to use instead)."""
    reduction = describe_gradients(
        "hora.tensorflow.DistributedGradientTape",
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=groups,
        num_groups=num_groups,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        process_set=process_set,
        strategy=strategy,
        instead=TAPE_INSTEAD,
        adasum=True,  # Horovod's tape reduces the gradients themselves with Adasum
    )
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape: Any = object.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hora_reducer = GradientReducer(reduction)
    tape._hora_local = []
    tape._hora_scale_local = scale_local_gradients
    return tape


def PartialDistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: int = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
    strategy: str | None = None,
) -> tf.GradientTape:
    """:func:`DistributedGradientTape` whose ``local_layers``' variables (and any ``register_local_source``) keep
    their local gradients (scaled by 1/size with ``scale_local_gradients``, as Horovod does)."""
    tape: Any = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
        strategy,
    )
    for layer in _local_layers(local_layers):
        tape.register_local_sources(layer.trainable_weights)
    return tape


def _local_layers(local_layers: Any) -> list[Any]:
    """``local_layers`` as a list of layers: None is none, one layer is a list of it; anything that is not a
    ``tf.keras.layers.Layer`` is Horovod's ValueError."""
    layer_type = tf.keras.layers.Layer
    if local_layers is None:
        return []
    if isinstance(local_layers, layer_type):
        return [local_layers]
    layers = list(local_layers)
    wrong = [type(layer).__name__ for layer in layers if not isinstance(layer, layer_type)]
    if wrong:
        raise ValueError(
            f"All local layers must be of tf.keras.layers.Layer type; got {', '.join(wrong)} "
            f"(pass the layer objects of your model, e.g. local_layers=[model.layers[0]])"
        )
    return layers
