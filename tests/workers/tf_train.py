"""Worker functions for the hora.tensorflow tests of gradients, tapes, optimizers, errors and process sets; each
check runs eagerly, inside a tf.function and in a v1 Session graph (``run_checks``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd
from workers.collectives import adasum_reference
from workers.tf_ops import MODES, Check, run_checks


def _grad(f: Any, x: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = f(x)
    return tape.gradient(loss, x)


def _gradient_checks(me: int, n: int) -> list[Check]:
    f32 = np.float32
    x = tf.constant(np.arange(3, dtype=f32) + me)
    w_np = np.array([1.0, 2.0, 3.0], f32)
    w = tf.constant(w_np)
    checks: list[Check] = [
        ("allreduce Sum grad", _grad(lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Sum) * w), x), n * w_np),
        ("allreduce Average grad", _grad(lambda t: tf.reduce_sum(hvd.allreduce(t) * w), x), w_np),
    ]
    rows = tf.constant(np.ones((me + 1, 2), f32))
    weights = np.arange(n * (n + 1) // 2 * 2, dtype=f32).reshape(-1, 2)
    start = me * (me + 1) // 2
    checks.append((
        "allgather grad",
        _grad(lambda t: tf.reduce_sum(hvd.allgather(t * (me + 1)) * weights), rows),
        n * weights[start : start + me + 1] * (me + 1),
    ))  # fmt: skip
    root = n - 1
    checks.append((
        "broadcast grad",
        _grad(lambda t: tf.reduce_sum(hvd.broadcast(t, root) * w), x),
        (n * w_np) if me == root else np.zeros(3, f32),
    ))  # fmt: skip
    sends = [1] * n
    data = tf.constant(np.ones((n, 2), f32))
    checks.append((
        "alltoall grad",
        _grad(lambda t: tf.reduce_sum(hvd.alltoall(t, splits=sends)[0] * (me + 1)), data),
        np.repeat(np.arange(1, n + 1, dtype=f32), 2).reshape(n, 2),
    ))  # fmt: skip
    scatter = tf.constant(np.ones((2 * n, 2), f32))
    checks.append((
        "reducescatter grad",
        _grad(lambda t: tf.reduce_sum(hvd.reducescatter(t, op=hvd.Sum) * (me + 1)), scatter),
        np.repeat(np.arange(1, n + 1, dtype=f32), 4).reshape(2 * n, 2),
    ))  # fmt: skip
    # DistributedGradientTape: d(v.v/2)/dv = v, averaged over ranks; one grouped op for both variables
    v1, v2 = tf.constant(np.full(2, me + 1.0, f32)), tf.constant(np.full((2, 2), 2.0 * me, f32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([v1, v2])
        loss = tf.reduce_sum(v1 * v1) / 2 + tf.reduce_sum(v2 * v2) / 2
    g1, g2 = hvd.DistributedGradientTape(tape).gradient(loss, [v1, v2])
    checks.append(("tape grad 1", g1, np.full(2, (n + 1) / 2, f32)))
    checks.append(("tape grad 2", g2, np.full((2, 2), float(n - 1), f32)))
    partial = hvd.PartialDistributedGradientTape(tape)
    partial.register_local_source(v2)
    p1, p2 = partial.gradient(loss, [v1, v2])
    checks.append(("partial tape shared", p1, np.full(2, (n + 1) / 2, f32)))
    p2_local = np.full((2, 2), 2.0 * me / n, f32)
    checks.append(("partial tape local (scaled by 1/size)", p2, p2_local))
    summing = hvd.PartialDistributedGradientTape(tape, op=hvd.Sum)
    summing.register_local_source(v2)
    q1, q2 = summing.gradient(loss, [v1, v2])
    checks.append(("partial tape shared under Sum", q1, np.full(2, n * (n + 1) / 2, f32)))
    checks.append(("partial tape local under Sum (1/size whatever the op, as Horovod)", q2, p2_local))
    # a local sparse gradient stays sparse (Horovod divides its values only)
    table = tf.constant(np.full((4, 2), me + 1.0, f32))
    with tf.GradientTape() as sparse_tape:
        sparse_tape.watch(table)
        picked = tf.reduce_sum(tf.gather(table, [1, 3]))
    local_sparse = hvd.PartialDistributedGradientTape(sparse_tape)
    local_sparse.register_local_source(table)
    (gs,) = local_sparse.gradient(picked, [table])
    stays_sparse = tf.constant(isinstance(gs, tf.IndexedSlices))
    checks.append(("partial tape local sparse stays IndexedSlices", stays_sparse, np.array(True)))
    picked_rows = np.array([[0, 0], [1, 1], [0, 0], [1, 1]], f32) / n
    checks.append(("partial tape local sparse values", tf.convert_to_tensor(gs), picked_rows))
    s1, _ = hvd.DistributedGradientTape(tape, op=hvd.Sum, num_groups=2).gradient(loss, [v1, v2])
    checks.append(("tape Sum in two groups", s1, np.full(2, n * (n + 1) / 2, f32)))
    d1, _ = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0).gradient(loss, [v1, v2])
    checks.append(("tape predivide", d1, np.full(2, (n + 1) / 2, f32)))
    return checks


def _optimizer_checks_v1(me: int, n: int) -> int:
    """TF1: DistributedOptimizer + BroadcastGlobalVariablesHook in a MonitoredTrainingSession."""
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", initializer=np.full(3, float(me), np.float32))
        x = tf.constant(np.full(3, me + 1.0, np.float32))
        loss = tf.reduce_sum(v * x)  # gradient x, averaged: (n + 1) / 2
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        step = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            assert np.array_equal(sess.run(v), np.zeros(3, np.float32)), "the hook did not broadcast"
            sess.run(step)
            got = sess.run(v)
    assert np.allclose(got, -0.5 * (n + 1) / 2), got
    return 1


def _aggregation_checks_v1(me: int, n: int) -> int:
    """TF1: backward_passes_per_step=2 sums two runs' gradients locally, allreduces every second run and applies
    only then (Horovod's LocalGradientAggregationHelper); the global step counts every run."""
    for average in (False, True):
        graph = tf.Graph()
        with graph.as_default():
            v = tf.compat.v1.get_variable("v", initializer=np.zeros(3, np.float32))
            x = tf.compat.v1.placeholder(tf.float32, [3])
            loss = tf.reduce_sum(v * x)  # gradient x
            opt = hvd.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.5), backward_passes_per_step=2,
                average_aggregated_gradients=average,
            )  # fmt: skip
            step = tf.compat.v1.train.get_or_create_global_step()
            train = opt.minimize(loss, global_step=step)
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                seen = []
                for i in range(4):
                    sess.run(train, {x: np.full(3, (me + 1.0) * (i + 1), np.float32)})
                    seen.append(float(sess.run(v)[0]))
                steps = int(sess.run(step))
        # runs 1+2 and 3+4 sum (me+1)*3 and (me+1)*7 locally; averaged over ranks: 3(n+1)/2 and 7(n+1)/2
        k = 2.0 if average else 1.0
        first, second = -0.5 * 3 * (n + 1) / 2 / k, -0.5 * 10 * (n + 1) / 2 / k
        assert np.allclose(seen, [0.0, first, first, second]), (average, seen)
        assert steps == 4, steps
    return 2


def gradients_worker(modes: list[str] = MODES) -> int:
    """Horovod's gradients of every op, the tapes and the TF1 optimizer, in ``modes``; broadcast_variables."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    checked = sum(run_checks(lambda: _gradient_checks(me, n), mode) for mode in modes)
    checked += _optimizer_checks_v1(me, n)
    checked += _aggregation_checks_v1(me, n)
    v = tf.Variable(np.full(4, float(me), np.float32))
    hvd.broadcast_variables([v], root_rank=n - 1)
    assert np.array_equal(v.numpy(), np.full(4, n - 1.0, np.float32))
    return checked


def _expect(error: type[BaseException], fn: Any, notes: list[str], what: str) -> None:
    try:
        fn()
    except error as exc:
        lines = [x for x in str(exc).strip().splitlines() if x.strip()]
        line = lines[-1] if what == "jit" else lines[0]  # tf.function puts "in user code:" first
        notes.append(f"{what}: {type(exc).__name__}: {line[:200]}")
        return
    raise AssertionError(f"{what}: no {error.__name__}")


def errors_worker() -> list[str]:
    """A mismatch fails every rank with FailedPreconditionError in every mode, and hora keeps working after it;
    bad arguments fail at build time."""
    hvd.init()
    me = hvd.rank()
    notes: list[str] = []
    shape = tf.ones([me + 1])
    _expect(tf.errors.FailedPreconditionError, lambda: hvd.allreduce(shape, name="eager.shape"), notes, "eager shape")
    fn = tf.function(lambda: hvd.allreduce(tf.ones([me + 1]), name="fn.shape"))
    _expect(tf.errors.FailedPreconditionError, fn, notes, "function shape")
    dtype = tf.function(lambda: hvd.allgather(tf.ones([2], tf.float32 if me == 0 else tf.float64), name="fn.dtype"))
    _expect(tf.errors.FailedPreconditionError, dtype, notes, "function dtype")
    graph = tf.Graph()
    with graph.as_default():
        bad = hvd.broadcast(tf.ones([2, me + 1]), 0, name="graph.shape")
        with tf.compat.v1.Session(graph=graph) as sess:
            _expect(tf.errors.FailedPreconditionError, lambda: sess.run(bad), notes, "graph shape")
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == hvd.size()  # still working
    _expect(ValueError, lambda: hvd.allreduce(tf.ones([2], tf.complex64)), notes, "dtype")
    _expect(NotImplementedError, lambda: hvd.allreduce(tf.ones([2], tf.int32), op=hvd.Adasum), notes, "adasum")
    _adasum(me, hvd.size())
    jit = tf.function(lambda: hvd.allreduce(tf.ones([2])), jit_compile=True)
    _expect(ValueError, jit, notes, "jit")
    _expect(ValueError, lambda: hvd.allreduce(tf.ones([2], tf.bool)), notes, "bool average")
    _optimizer_errors(notes)
    return notes


def _adasum(me: int, n: int) -> None:
    """Orthogonal gradients add under Adasum: through allreduce and through DistributedGradientTape(op=Adasum);
    at N=2, the TF1 and Keras optimizers against Horovod's formula (:func:`_adasum_pair`)."""
    if n & (n - 1):
        return  # refused (checked by the numpy suite)
    np.testing.assert_allclose(hvd.allreduce(tf.one_hot(me, n), op=hvd.Adasum).numpy(), np.ones(n))
    x = tf.Variable(tf.zeros([n]))
    with tf.GradientTape() as tape:
        loss = 3.0 * x[me]
    grad = hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, x)
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), np.full(n, 3.0))
    if n == 2:
        for passes in (1, 2):
            for mode in MODES:
                _adasum_tf1(me, passes, mode)
        _adasum_keras(me)


def _adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's Adasum of two ranks' tensors in float64, ``(1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b``."""
    return adasum_reference([a, b])


# Two ranks' gradients per variable: neither orthogonal nor parallel nor of equal norms, so every term of the formula
# counts (a.b = -1.5 and -2.25).
_ADASUM_GRADS = [
    (np.array([1.0, 2.0, 0.0], np.float32), np.array([[1.0, 0.0], [2.0, -1.0]], np.float32)),
    (np.array([0.5, -1.0, 3.0], np.float32), np.array([[-0.25, 1.0], [-1.0, 0.5]], np.float32)),
]
_ADASUM_START = (np.array([1.0, -2.0, 0.5], np.float32), np.array([[0.0, 1.0], [-1.0, 2.0]], np.float32))


def _adasum_tf1(me: int, passes: int, mode: str) -> None:
    """TF1 DistributedOptimizer(GradientDescent, op=Adasum), two steps with gradients (step+1) * g: every rank's local
    delta is -lr * grad, and on a communication step (every ``passes``-th) each variable moves to
    start + adasum(delta_0, delta_1); the other steps are this rank's own (Horovod's _DistributedAdasumOptimizer)."""
    lr, mine = 0.5, _ADASUM_GRADS[me]
    seen: list[list[np.ndarray]] = []

    def make() -> Any:
        opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
        return hvd.DistributedOptimizer(opt, op=hvd.Adasum, backward_passes_per_step=passes)

    if mode == "session":
        graph = tf.Graph()
        with graph.as_default():
            vs = [tf.compat.v1.get_variable(f"v{i}", initializer=s) for i, s in enumerate(_ADASUM_START)]
            scale = tf.compat.v1.placeholder(tf.float32, [])
            loss = sum(tf.reduce_sum(v * g * scale) for v, g in zip(vs, mine))
            opt = make()
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train = opt.minimize(loss, global_step=global_step)
            assert opt.get_slot_names() == ["delta_start"], opt.get_slot_names()
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for step in range(2):
                    sess.run(train, {scale: step + 1.0})
                    seen.append(sess.run(vs))
                assert int(sess.run(global_step)) == 2
    else:
        vs = [tf.Variable(s) for s in _ADASUM_START]
        opt = make()

        def apply(scale: tf.Tensor) -> None:
            with tf.GradientTape() as tape:
                loss = sum(tf.reduce_sum(v * g * scale) for v, g in zip(vs, mine))
            opt.apply_gradients(zip(tape.gradient(loss, vs), vs))

        run = tf.function(apply) if mode == "function" else apply
        for step in range(2):
            run(tf.constant(step + 1.0))
            seen.append([v.numpy() for v in vs])
    a, b = _ADASUM_GRADS
    if passes == 1:  # both steps communicate: start moves by the Adasum of the two ranks' steps, twice
        once = [s + _adasum_pair(-lr * x, -lr * y) for s, x, y in zip(_ADASUM_START, a, b)]
        want = [once, [s + _adasum_pair(-2 * lr * x, -2 * lr * y) for s, x, y in zip(once, a, b)]]
    else:  # the first step is this rank's own; the second combines both steps' deltas (-lr * 3g)
        want = [
            [s - lr * g for s, g in zip(_ADASUM_START, mine)],
            [s + _adasum_pair(-3 * lr * x, -3 * lr * y) for s, x, y in zip(_ADASUM_START, a, b)],
        ]
    for step, (got_step, want_step) in enumerate(zip(seen, want)):
        for got, expected in zip(got_step, want_step):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=f"tf1 {mode} {passes} {step}")


def _adasum_keras(me: int) -> None:
    """hora.keras.DistributedOptimizer(SGD, op=Adasum) applies the Adasum of the ranks' gradients."""
    import keras

    import hora.keras as hvd_keras

    lr = 0.5
    vs = [keras.Variable(s) for s in _ADASUM_START]
    hvd_keras.DistributedOptimizer(keras.optimizers.SGD(lr), op=hvd.Adasum).apply(
        [tf.constant(g) for g in _ADASUM_GRADS[me]], vs
    )
    for v, s, x, y in zip(vs, _ADASUM_START, *_ADASUM_GRADS):
        np.testing.assert_allclose(np.asarray(v), s - lr * _adasum_pair(x, y), rtol=1e-6, atol=1e-6)


def _optimizer_errors(notes: list[str]) -> None:
    """Adasum's refusals (Horovod's ValueError for average_aggregated_gradients; its message for sparse gradients, an
    UnsupportedError that is a NotImplementedError too; no parameter servers); a tape refuses
    strategy='parameter_server'; IndexedSlices refuse scale factors (Horovod's rule)."""
    import keras

    import hora.keras as hvd_keras
    from hora.errors import UnsupportedError

    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    averaged = {"backward_passes_per_step": 2, "average_aggregated_gradients": True}
    _expect(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum, **averaged),
        notes,
        "tf1 adasum",
    )
    rows = tf.Variable(tf.zeros([4, 3]))
    sparse = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), tf.constant([4, 3], tf.int64))
    _expect(
        NotImplementedError,
        lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum).apply([sparse], [rows]),
        notes,
        "keras adasum",
    )
    _expect(
        UnsupportedError,
        lambda: hvd.DistributedGradientTape(tf.GradientTape(), strategy="parameter_server"),
        notes,
        "tape strategy",
    )
    slices = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), tf.constant([4, 3], tf.int64))
    _expect(
        NotImplementedError,
        lambda: hvd.allreduce(slices, op=hvd.Sum, prescale_factor=0.5),
        notes,
        "slices scale",
    )
    _expect(
        ValueError,
        lambda: hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[tf.Variable(1.0)]),
        notes,
        "partial tape layers",
    )
    _expect(
        UnsupportedError,
        lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum, strategy="parameter_server"),
        notes,
        "keras adasum servers",
    )


def process_set_worker() -> list[str]:
    """Ranks 0 and 2 as a set at N=3: collectives within it in every mode; rank 1 is refused."""
    hvd.init()
    me = hvd.rank()
    ps = hvd.add_process_set([0, 2])
    notes = []
    if me in (0, 2):

        def build() -> list[Check]:
            x = tf.constant([float(me)])
            return [
                ("set allreduce", hvd.allreduce(x, op=hvd.Sum, process_set=ps), np.array([2.0], np.float32)),
                ("set allgather", hvd.allgather(x, process_set=ps), np.array([0.0, 2.0], np.float32)),
                ("set broadcast", hvd.broadcast(x, 2, process_set=ps), np.array([2.0], np.float32)),
                ("set size_op", hvd.size_op(ps.process_set_id), np.int32(2)),
                ("set included", hvd.process_set_included_op(ps.process_set_id), np.int32(1)),
            ]

        for mode in MODES:
            run_checks(build, mode)
    else:
        assert int(hvd.process_set_included_op(ps.process_set_id)) == 0
        try:
            hvd.allreduce(tf.ones([1]), process_set=ps)
        except Exception as exc:
            notes.append(str(exc))
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == 3.0
    hvd.barrier()
    try:  # Horovod's rule, checked before any collective (so on every rank, in the set or not)
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum, process_set=ps)
    except NotImplementedError as exc:
        assert str(exc) == "Adasum does not support non-global process sets yet.", exc
    else:
        raise AssertionError("the TF1 Adasum optimizer took a process set")
    return notes



def data_worker() -> int:
    """PipeModeDataset reads one epoch file per iteration of the dataset (SageMaker's <channel>_<epoch> naming);
    shard() gives each rank its part."""
    import tempfile
    from pathlib import Path

    from hora.data import encode_recordio, encode_tfrecord

    with tempfile.TemporaryDirectory() as tmp:
        for epoch in range(2):
            records = b"".join(encode_tfrecord(f"e{epoch}r{i}".encode()) for i in range(5))
            (Path(tmp) / f"train_{epoch}").write_bytes(records)
        ds = hvd.PipeModeDataset(str(Path(tmp) / "train"), record_format="TFRecord")
        first = [bytes(r.numpy()) for r in ds]
        second = [bytes(r.numpy()) for r in ds]
        assert first == [f"e0r{i}".encode() for i in range(5)], first
        assert second == [f"e1r{i}".encode() for i in range(5)], second
        for epoch in range(2):  # SageMaker's RecordIO framing, read the same way
            (Path(tmp) / f"rec_{epoch}").write_bytes(b"".join(encode_recordio(b"r%d.%d" % (epoch, i)) for i in range(3)))
        rec = hvd.PipeModeDataset(str(Path(tmp) / "rec"), record_format="RecordIO")
        assert [bytes(r.numpy()) for r in rec] == [b"r0.0", b"r0.1", b"r0.2"]
        assert [bytes(r.numpy()) for r in rec] == [b"r1.0", b"r1.1", b"r1.2"]
    try:
        hvd.PipeModeDataset("train", record_format="Parquet")
    except NotImplementedError as exc:
        assert "Parquet" in str(exc) and "RecordIO" in str(exc), exc
    else:
        raise AssertionError("an unknown record format was accepted")
    me, n = hvd.rank(), hvd.size()
    shard = [int(x) for x in hvd.shard(tf.data.Dataset.range(10), by="rank")]
    assert shard == list(range(me, 10, n)), shard
    return len(first) + len(second)


def sync_batch_norm_worker() -> float:
    """SyncBatchNormalization in training normalises each rank's rows with the moments of every rank's batch: the
    same as BatchNormalization over the concatenated batch, also with a mask. Returns the largest difference."""
    import keras

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    full = np.random.default_rng(0).standard_normal((4 * n, 3)).astype(np.float32)
    layer = hvd.SyncBatchNormalization(momentum=0.0)
    out = layer(tf.constant(full[me * 4 : (me + 1) * 4]), training=True).numpy()
    ref = keras.layers.BatchNormalization(momentum=0.0)
    expected = ref(tf.constant(full), training=True).numpy()[me * 4 : (me + 1) * 4]
    assert np.allclose(layer.moving_mean.numpy(), ref.moving_mean.numpy(), atol=1e-6)
    worst = float(np.abs(out - expected).max())
    # with a mask (a sequence batch): only the kept steps of every rank count, as Keras counts them on one rank
    rng = np.random.default_rng(1)
    seq = rng.standard_normal((4 * n, 5, 3)).astype(np.float32)
    mask = rng.random((4 * n, 5)) < 0.6
    mine = slice(me * 4, (me + 1) * 4)
    masked = hvd.SyncBatchNormalization(momentum=0.0)
    out = masked(tf.constant(seq[mine]), training=True, mask=tf.constant(mask[mine])).numpy()
    ref = keras.layers.BatchNormalization(momentum=0.0)
    expected = ref(tf.constant(seq), training=True, mask=tf.constant(mask)).numpy()[mine]
    assert np.allclose(masked.moving_variance.numpy(), ref.moving_variance.numpy(), atol=1e-5)
    return max(worst, float(np.abs(out - expected).max()))


def suite_worker(modes: list[str], parts: list[str]) -> dict[str, Any]:
    """One TensorFlow start for several checks (TensorFlow and Keras cost seconds to import in every rank): the op
    checks in ``modes``, then each of ``parts`` ("gradients" in ``modes``, "errors", "process_sets", "fit",
    "fit_callbacks", "partial"); returns each part's result by name."""
    from workers.keras_fit import fit_worker
    from workers.tf_ops import ops_worker

    out: dict[str, Any] = {"ops": ops_worker(modes)}
    for part in parts:
        if part == "gradients":
            out[part] = gradients_worker(modes)
        elif part == "errors":
            out[part] = errors_worker()
        elif part == "process_sets":
            out[part] = process_set_worker()
        elif part == "data":
            out[part] = data_worker()
        elif part == "syncbn":
            out[part] = sync_batch_norm_worker()
        elif part == "partial":
            from workers.keras_partial import partial_worker

            out[part] = partial_worker()
        else:
            out[part] = fit_worker(with_callbacks=part == "fit_callbacks")
    return out
