"""Reducing a list of gradients the way Horovod's optimizers and tapes do: one grouped op (or one per group), None
gradients left alone, ``sparse_as_dense``, ``gradient_predivide_factor``, compression. Shared by
``DistributedGradientTape``, the TF1 ``DistributedOptimizer`` and hora.keras."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hora._dtypes import ReduceOp
from hora._frontend import ProcessSet, global_process_set
from hora.tensorflow.compression import Compression
from hora.tensorflow.reductions import grouped_allreduce, resolve_op, set_size

__all__ = ["GradientReducer"]


class GradientReducer:
    """Reduces gradients across ranks with Horovod's optimizer arguments (checked when constructed)."""

    def __init__(
        self,
        op: int = ReduceOp.AVERAGE,
        compression: Any = Compression.none,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        groups: Any = None,
        process_set: ProcessSet = global_process_set,
    ) -> None:
        self.op = resolve_op(None, op)
        if gradient_predivide_factor != 1.0 and self.op is not ReduceOp.AVERAGE:
            raise ValueError("gradient_predivide_factor needs op=Average (it splits the averaging around the sum)")
        if groups is not None and not (isinstance(groups, int) and groups >= 0) and not isinstance(groups, list):
            raise ValueError(f"groups must be a non-negative int or a list of lists of variables, got {groups!r}")
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.predivide = float(gradient_predivide_factor)
        self.groups = groups
        self.process_set = process_set

    def _factors(self) -> tuple[ReduceOp, float, float]:
        if self.op is ReduceOp.AVERAGE and self.predivide != 1.0:
            return ReduceOp.SUM, 1.0 / self.predivide, self.predivide / set_size(self.process_set)
        return self.op, 1.0, 1.0

    def _partition(self, present: list[int], variables: Sequence[Any] | None) -> list[list[int]]:
        if not self.groups:
            return [present]
        if isinstance(self.groups, int):
            n = min(self.groups, len(present)) or 1
            return [present[i * len(present) // n : (i + 1) * len(present) // n] for i in range(n)]
        if variables is None:
            raise ValueError("groups given as lists of variables need the variables the gradients belong to")
        ids = {id(v): i for i, v in enumerate(variables)}
        parts, used = [], set()
        for group in self.groups:
            idx = [ids[id(v)] for v in group if id(v) in ids and ids[id(v)] in present]
            used.update(idx)
            if idx:
                parts.append(idx)
        rest = [i for i in present if i not in used]
        return [*parts, *([rest] if rest else [])]

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any] | None = None, name: str | None = None) -> list[Any]:
        """The reduced gradients, in order (None stays None)."""
        grads = list(grads)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        op, pre, post = self._factors()
        out = list(grads)
        for k, part in enumerate(self._partition(present, variables)):
            reduced = grouped_allreduce(
                [grads[i] for i in part], compression=self.compression, op=op, prescale_factor=pre,
                postscale_factor=post, process_set=self.process_set,
                name=None if name is None else f"{name}.{k}",
            )  # fmt: skip
            for i, r in zip(part, reduced):
                out[i] = r
        return out
