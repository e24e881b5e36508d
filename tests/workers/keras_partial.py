"""Worker part for hora.keras.PartialDistributedOptimizer (and ``register_local_var``): a model ``x.a + x.b`` of two
bias-free Dense(1) layers, ``a`` local and ``b`` shared, fitted with SGD on each rank's own data. The result holds
each variant's trained weights and the same training computed by hand in NumPy from every rank's data (which every
rank can make: the data come from the rank's seed), so the test can check that ``a`` follows this rank's own
gradients (divided by the number of ranks with ``scale_local_gradients``) while ``b`` follows the reduced ones.

Runs in whatever Keras the environment sets up: Keras 3 on KERAS_BACKEND, or tf_keras under TF_USE_LEGACY_KERAS=1.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

BATCH = 8
LR = 0.1
A0, B0 = 0.1, -0.2  # the initial kernels of the local and the shared layer, on every rank


def _data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s own 4 batches: y = x.w + noise with a different w per rank."""
    rng = np.random.default_rng(70 + rank)
    x = rng.normal(size=(4 * BATCH, 3)).astype(np.float32)
    w = np.array([[1.0], [-2.0], [0.5]], np.float32) * (rank + 1)
    y = (x @ w + 0.1 * rng.normal(size=(4 * BATCH, 1))).astype(np.float32)
    return x, y


def _by_hand(n: int, op_sum: bool, scale: bool, passes: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(each rank's local kernel, the shared kernel) after one epoch of SGD, in float64: every update sums
    ``passes`` batches' gradients (taken at the same weights); the shared kernel moves by the mean (sum with
    ``op_sum``) over ranks, the local one by its own rank's, divided by ``n`` with ``scale``."""
    data = [_data(r) for r in range(n)]
    a = [np.full((3, 1), A0) for _ in range(n)]
    b = np.full((3, 1), B0)
    for step in range(4 // passes):
        grads = []
        for r, (x, y) in enumerate(data):
            g = np.zeros((3, 1))
            for p in range(passes):
                rows = slice((step * passes + p) * BATCH, (step * passes + p + 1) * BATCH)
                xb, yb = x[rows].astype(np.float64), y[rows].astype(np.float64)
                g += 2.0 / BATCH * xb.T @ (xb @ (a[r] + b) - yb)  # d/dk mean((x.(a+b) - y)^2), k = a or b
            grads.append(g)
        shared = sum(grads) if op_sum else sum(grads) / n
        a = [a[r] - LR * (grads[r] / n if scale else grads[r]) for r in range(n)]
        b = b - LR * shared
    return a, b


def _fit(keras: Any, make_optimizer: Any) -> tuple[np.ndarray, np.ndarray]:
    import hora.keras as hvd

    x, y = _data(hvd.rank())
    inp = keras.Input((3,))
    local = keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(A0))
    shared = keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(B0))
    model = keras.Model(inp, keras.layers.Add()([local(inp), shared(inp)]))
    model.compile(make_optimizer(local), "mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return local.get_weights()[0], shared.get_weights()[0]


def partial_worker() -> dict[str, Any]:
    """Per variant: [this rank's local kernel, the shared kernel, the local and shared kernels by hand]; and the
    errors of a bad ``local_layers`` and a bad ``op``."""
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tensorflow as tf

        keras = tf.keras
    else:
        import keras  # type: ignore[no-redef]

    import hora.keras as hvd

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    sgd = keras.optimizers.SGD

    def accumulated(local: Any) -> Any:
        opt = hvd.DistributedOptimizer(sgd(LR), backward_passes_per_step=2)
        opt.register_local_var(local.kernel)
        return opt

    def scaled(local: Any) -> Any:
        return hvd.PartialDistributedOptimizer(sgd(LR), local_layers=local)

    def summed(local: Any) -> Any:
        return hvd.PartialDistributedOptimizer(sgd(LR), op=hvd.Sum, local_layers=[local])

    def unscaled(local: Any) -> Any:
        return hvd.PartialDistributedOptimizer(sgd(LR), local_layers=[local], scale_local_gradients=False)

    # name: (optimizer, op=Sum, scale_local_gradients, passes per update)
    variants = {
        "scaled": (scaled, False, True, 1),
        "sum": (summed, True, True, 1),
        "unscaled": (unscaled, False, False, 1),
        "accumulated": (accumulated, False, True, 2),
    }
    out: dict[str, Any] = {}
    for name, (make, op_sum, scale, passes) in variants.items():
        got_a, got_b = _fit(keras, make)
        want_a, want_b = _by_hand(n, op_sum, scale, passes)
        out[name] = [got.ravel().tolist() for got in (got_a, got_b, want_a[me], want_b)]
    errors = []
    for bad in ({"local_layers": [object()]}, {"op": hvd.Max}):
        try:
            hvd.PartialDistributedOptimizer(sgd(LR), **bad)
        except ValueError as e:
            errors.append(str(e))
    out["errors"] = errors
    return out
