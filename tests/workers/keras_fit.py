"""Worker functions for the hora.keras tests: Keras ``fit`` on scikit-learn's digits with DistributedOptimizer and
Horovod's callbacks. The backend is whatever KERAS_BACKEND says when the worker starts (TensorFlow by default).

Equivalence check: with a fixed global batch of 64 split over N ranks in order (rank r takes rows r*64/N ... of
every global batch) and no shuffling, averaging the gradients makes N-rank training compute what 1-rank training
computes, up to float rounding; so the test accuracy must match the 1-rank run's closely.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import numpy as np

GLOBAL_BATCH = 64


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    train = 22 * GLOBAL_BATCH
    return x[:train], y[:train], x[train:], y[train:]


def _shard(a: np.ndarray, rank: int, n: int) -> np.ndarray:
    per = GLOBAL_BATCH // n
    batches = a.reshape(-1, GLOBAL_BATCH, *a.shape[1:])
    return batches[:, rank * per : (rank + 1) * per].reshape(-1, *a.shape[1:])


def _model(keras: Any, seed: int) -> Any:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def fit_worker(epochs: int = 8, with_callbacks: bool = False) -> dict[str, Any]:
    """Keras 3 fit with DistributedOptimizer; returns what the test compares across ranks and with the 1-rank run
    (and, ``with_callbacks``, what :func:`callbacks_worker` returns, under "callbacks")."""
    import keras

    import hora.keras as hvd

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    xt, yt, xv, yv = _data()
    model = _model(keras, seed=100 + me)  # different initial weights per rank: the callback must broadcast them
    base = keras.optimizers.Adam(0.01)
    opt = hvd.DistributedOptimizer(base)
    assert type(opt).__name__ == "Adam" and opt.get_config() == base.get_config(), opt.get_config()
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(
        _shard(xt, me, n), _shard(yt, me, n), batch_size=GLOBAL_BATCH // n, epochs=epochs, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )  # fmt: skip
    _, accuracy = model.evaluate(xv, yv, verbose=0)
    result: dict[str, Any] = {"accuracy": float(accuracy), "weights": _digest(model)}
    result["optimizer"] = hashlib.sha256(
        b"".join(np.asarray(v.numpy()).tobytes() for v in model.optimizer.variables)
    ).hexdigest()
    # a model saved with the wrapped optimizer reloads with plain Keras (no hora class in the file)
    if me == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.keras")
            model.save(path)
            plain = keras.models.load_model(path)
            assert type(plain.optimizer) is keras.optimizers.Adam, type(plain.optimizer)
            again = hvd.load_model(path)
            assert type(again.optimizer).__name__ == "Adam" and hasattr(type(again.optimizer), "_hora")
            assert int(again.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())
    if with_callbacks:
        result["callbacks"] = callbacks_worker()
    return result


def callbacks_worker() -> dict[str, Any]:
    """Learning-rate warm-up and schedule values per epoch, metrics averaged over ranks, rank-0 best checkpoint."""
    import keras

    import hora.keras as hvd

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    xt, yt, xv, yv = _data()
    model = _model(keras, seed=7)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "sparse_categorical_crossentropy")
    seen: list[float] = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(float(logs["loss"])))
    per_epoch = len(_shard(xt, me, n)) // (GLOBAL_BATCH // n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"best-{me}.keras")
        history = model.fit(
            _shard(xt, me, n)[: 4 * (GLOBAL_BATCH // n)], _shard(yt, me, n)[: 4 * (GLOBAL_BATCH // n)],
            batch_size=GLOBAL_BATCH // n, epochs=4, shuffle=False, verbose=0,
            validation_data=(xv[me::n], yv[me::n]),
            callbacks=[
                hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2),
                hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda e: 0.5 ** e, start_epoch=2),
                hvd.callbacks.MetricAverageCallback(),
                record,
                hvd.callbacks.BestModelCheckpoint(path, monitor="val_loss"),
            ],
        )  # fmt: skip
        wrote = os.path.exists(path)
    del per_epoch
    # backward_passes_per_step=2 is Keras 3's gradient accumulation, reduced once per update: ranks stay equal
    acc = _model(keras, seed=11 + me)
    acc_opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    assert acc_opt.gradient_accumulation_steps == 2
    acc.compile(acc_opt, "sparse_categorical_crossentropy")
    acc.fit(_shard(xt, me, n)[: 4 * (GLOBAL_BATCH // n)], _shard(yt, me, n)[: 4 * (GLOBAL_BATCH // n)],
            batch_size=GLOBAL_BATCH // n, epochs=1, shuffle=False, verbose=0,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip
    return {"lr": [float(x) for x in history.history["lr"]], "val_loss": seen, "wrote": wrote,
            "val_logged": [float(x) for x in history.history["val_loss"]], "accumulated": _digest(acc)}  # fmt: skip


def flavour_fit_worker() -> dict[str, Any]:
    """A short fit through ``hora.tensorflow.keras`` as the environment sets Keras up: tf_keras under
    TF_USE_LEGACY_KERAS=1, or Keras 3 on the backend KERAS_BACKEND names (torch here)."""
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tensorflow as tf

        import hora.tensorflow.keras as hvd

        keras = tf.keras
    else:
        import keras

        import hora.keras as hvd  # type: ignore[no-redef]
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    xt, yt, xv, yv = _data()
    model = _model(keras, seed=100 + me)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(
        _shard(xt, me, n), _shard(yt, me, n), batch_size=GLOBAL_BATCH // n, epochs=2, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )  # fmt: skip
    out = {
        "module": type(opt).__module__, "class": type(opt).__name__, "backend": keras.backend.backend(),
        "accuracy": float(model.evaluate(xv, yv, verbose=0)[1]), "weights": _digest(model),
        "local_variables": _local_variables(keras, hvd, me),
    }  # fmt: skip
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        out.update(_tf_keras_extras(keras, hvd, me, n))
    if n == 2:
        out["adasum"] = _adasum(keras, hvd, me)
    from workers.keras_partial import partial_worker

    out["partial"] = partial_worker()
    return out


def _local_variables(keras: Any, hvd: Any, me: int) -> list[bool]:
    """BroadcastGlobalVariablesCallback(0, local_variables=...): the local variable keeps each rank's value, the
    others get rank 0's. Returns [local kept (differs from rank 0's), the rest equal to rank 0's]."""
    model = _model(keras, seed=500 + me)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    local = model.layers[0].kernel
    cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=local)
    cb.set_model(model)
    cb.on_train_begin()
    everyone = hvd.allgather_object([np.asarray(v) for v in model.get_weights()])
    others = all(np.array_equal(a, b) for a, b in zip(everyone[0][1:], everyone[-1][1:]))
    return [not np.array_equal(everyone[0][0], everyone[-1][0]), others]


def _tf_keras_extras(keras: Any, hvd: Any, me: int, n: int) -> dict[str, Any]:
    """tf_keras only: backward_passes_per_step=2 sums two calls locally and applies their reduced sum on the second
    (eagerly and in a tf.function), as Horovod does; a user's subclass of a tf_keras optimizer is wrapped as tf_keras."""
    import tensorflow as tf

    out: dict[str, Any] = {
        "aggregated_eager": _aggregated(keras, hvd, me, compiled=False),
        "aggregated_function": _aggregated(keras, hvd, me, compiled=True),
    }

    class MySGD(keras.optimizers.SGD):  # type: ignore[misc, name-defined]
        pass

    v = tf.Variable([0.0])
    sub = hvd.DistributedOptimizer(MySGD(1.0))
    sub.apply_gradients([(tf.constant([float(me + 1)]), v)])
    out["subclass"] = [type(sub).__name__, float(v.numpy()[0])]
    return out


def _aggregated(keras: Any, hvd: Any, me: int, compiled: bool) -> list[list[float]]:
    """Four apply_gradients calls with backward_passes_per_step=2: [w0, w1, iterations] after each."""
    import tensorflow as tf

    w = tf.Variable([1.0, 2.0])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5), backward_passes_per_step=2)

    def apply(g: Any) -> Any:
        return opt.apply_gradients([(g, w)])

    step = tf.function(apply) if compiled else apply
    seen = []
    for g in ([1.0, 1.0], [2.0, 0.0], [1.0, 0.0], [0.0, 1.0]):
        step(tf.constant(g) * (me + 1))
        seen.append([*w.numpy().tolist(), int(opt.iterations.numpy())])
    return seen


def _adasum(keras: Any, hvd: Any, me: int) -> list[list[float]]:
    """DistributedOptimizer(SGD, op=Adasum) on this flavour (tf_keras or a Keras 3 backend) at N=2: [the variable
    after one step, w0 - lr * the Adasum of the two ranks' gradients (Horovod's formula, in numpy)]."""
    from workers.collectives import adasum_reference

    lr, w0 = 0.5, np.array([1.0, -2.0, 0.5], np.float32)
    grads = [np.array([1.0, 2.0, 0.0], np.float32), np.array([0.5, -1.0, 3.0], np.float32)]  # a.b = -1.5
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr), op=hvd.Adasum)
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tensorflow as tf

        w = tf.Variable(w0)
        opt.apply_gradients([(tf.constant(grads[me]), w)])
        got = w.numpy()
    else:
        w = keras.Variable(w0)
        opt.apply([keras.ops.convert_to_tensor(grads[me])], [w])
        got = keras.ops.convert_to_numpy(w)
    return [np.asarray(got).tolist(), (w0 - lr * adasum_reference(grads)).tolist()]
