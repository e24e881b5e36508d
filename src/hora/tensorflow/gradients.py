"""Reducing a list of gradients the way Horovod's optimizers and tapes do, as a :class:`GradientReduction` describes
it: one grouped op (or one per group), None gradients left alone, ``sparse_as_dense``, the predivide factors,
compression. Shared by ``DistributedGradientTape``, the TF1 ``DistributedOptimizer`` and hora.keras."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hora._frontend.gradients import GradientReduction
from hora.tensorflow.compression import Compression
from hora.tensorflow.reductions import grouped_allreduce

__all__ = ["GradientReducer"]


class GradientReducer:
    """Reduces gradients across ranks as ``reduction`` says."""

    def __init__(self, reduction: GradientReduction) -> None:
        self.reduction = reduction
        self.compression = reduction.compression if reduction.compression is not None else Compression.none

    def reduce(
        self, grads: Sequence[Any], variables: Sequence[Any] | None = None, name: str | None = None
    ) -> list[Any]:
        """The reduced gradients, in order (None stays None)."""
        r = self.reduction
        grads = list(grads)
        if r.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        owners = None if variables is None else [variables[i] for i in present]
        if owners is None and not isinstance(r.groups, (int, type(None))):
            raise ValueError("groups given as lists of variables need the variables the gradients belong to")
        out = list(grads)
        for k, part in enumerate(r.partition(present, owners)):
            reduced = grouped_allreduce(
                [grads[i] for i in part],
                compression=self.compression,
                op=int(r.op),
                prescale_factor=r.prescale,
                postscale_factor=r.postscale,
                process_set=r.process_set,
                name=None if name is None else f"{name}.{k}",
            )
            for i, red in zip(part, reduced):
                out[i] = red
        return out
