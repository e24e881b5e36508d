"""Local gradient aggregation for tf_keras optimizers (``backward_passes_per_step`` = k > 1), as Horovod's
``LocalGradientAggregationHelperEager`` does it: every call adds the gradients into local accumulators (variables)
and counts; the k-th call reduces the sums across ranks (divided by k with ``average_aggregated_gradients``) and
clears them, and only that call applies them; the others just advance the optimizer's ``iterations``. Works eagerly
and inside ``tf.function`` (Keras ``fit``): the counter and accumulators are created on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["LocalAggregation"]


class LocalAggregation:
    """One wrapped optimizer's accumulators and pass counter."""

    def __init__(self, passes: int, average: bool, sparse_as_dense: bool) -> None:
        self.passes, self.average, self.sparse_as_dense = passes, average, sparse_as_dense
        self.counter: Any = None
        self.sums: dict[int, Any] = {}

    def compute(self, grads: list[Any], reduce: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """The reduced sums on every k-th call, this rank's running sums otherwise (None stays None)."""
        dense = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError(
                        "IndexedSlices are not supported when `backward_passes_per_step` > 1 and `sparse_as_dense` "
                        "is False; pass sparse_as_dense=True"
                    )
                g = tf.convert_to_tensor(g)
            dense.append(g)
        with tf.init_scope():  # created once, outside any tf.function's graph
            if self.counter is None:
                self.counter = tf.Variable(
                    0, trainable=False, dtype=tf.int32, name="hora_aggregation_counter"
                )
            for i, g in enumerate(dense):
                if g is not None and i not in self.sums:
                    self.sums[i] = tf.Variable(
                        tf.zeros(g.shape, g.dtype), trainable=False, name=f"hora_aggregated_{i}"
                    )
        present = [i for i, g in enumerate(dense) if g is not None]
        running = [self.sums[i].assign_add(dense[i]) for i in present]
        counted = self.counter.assign_add(1)
        with tf.control_dependencies([counted, *running]):
            totals = [self.sums[i].read_value() for i in present]

        def reduced() -> list[Any]:
            out = reduce(self._place(totals, present, len(dense)))
            out = [out[i] for i in present]
            if self.average:
                out = [t / self.passes for t in out]
            with tf.control_dependencies(out):
                clear = [
                    self.counter.assign(0),
                    *[self.sums[i].assign(tf.zeros_like(self.sums[i])) for i in present],
                ]
            with tf.control_dependencies(clear):
                return [tf.identity(t) for t in out]

        if not present:
            return list(dense)
        result = tf.cond(tf.equal(counted, self.passes), reduced, lambda: [tf.identity(t) for t in totals])
        return self._place(list(result), present, len(dense))

    @staticmethod
    def _place(values: list[Any], present: list[int], n: int) -> list[Any]:
        out: list[Any] = [None] * n
        for i, v in zip(present, values):
            out[i] = v
        return out

    def apply(self, apply: Callable[[], Any], optimizer: Any) -> Any:
        """``apply()`` on the calls that reduced (the counter back at 0); otherwise only ``iterations`` advances."""

        def skip() -> Any:
            iterations = getattr(optimizer, "iterations", None)
            if iterations is None:
                return tf.constant(False)
            iterations.assign_add(1)
            return tf.constant(False)

        def run() -> Any:
            apply()
            return tf.constant(True)

        return tf.cond(tf.equal(self.counter, 0), run, skip)
