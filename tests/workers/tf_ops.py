"""Worker functions for the hora.tensorflow tests. Each check is built once as ops and run in every mode — eagerly,
inside one ``tf.function`` and in one ``tf.compat.v1`` Session graph — and compared with a numpy computation of
what every rank contributed (each rank can rebuild any other rank's input from its rank)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
INTS = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64]
ALL = FLOATS + INTS + [tf.bool]
MODES = ["eager", "function", "session"]

Check = tuple[str, Any, Any]  # (what, tensor built by hora, expected numpy value)


def make(rank: int, dtype: tf.DType, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    """Small exact values (integers a float16 holds exactly) that differ per rank."""
    rng = np.random.default_rng(1000 * rank + salt)
    npt = dtype.as_numpy_dtype
    if dtype == tf.bool:
        return rng.integers(0, 2, shape).astype(bool)
    low = 0 if dtype == tf.uint8 else -5
    return rng.integers(low, 6, shape).astype(npt)


def reference(op: int, arrays: list[np.ndarray]) -> np.ndarray:
    dtype = arrays[0].dtype
    if dtype == np.bool_:
        stack = np.stack(arrays)
        return stack.all(0) if op in (hvd.Min, hvd.Product) else stack.any(0)
    stack = np.stack([a.astype(np.float64) for a in arrays])
    out = {
        hvd.Sum: lambda: stack.sum(0),
        hvd.Average: lambda: stack.sum(0) / len(arrays),
        hvd.Min: lambda: stack.min(0),
        hvd.Max: lambda: stack.max(0),
        hvd.Product: lambda: stack.prod(0),
    }[op]()
    return out.astype(dtype)


def close(actual: Any, expected: np.ndarray, what: str) -> None:
    actual = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual)  # np.asarray fails on 0-d bfloat16
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if np.issubdtype(expected.dtype, np.floating) or expected.dtype.name == "bfloat16":
        tol = 1e-2 if expected.dtype.itemsize == 2 else 1e-6
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol, err_msg=what)
    else:
        assert np.array_equal(actual, expected), f"{what}: {actual} != {expected}"


def run_checks(build: Callable[[], list[Check]], mode: str) -> int:
    """Build the checks in ``mode``, run them, compare; returns how many were compared."""
    if mode == "eager":
        checks = build()
        values = [t for _, t, _ in checks]
    elif mode == "function":
        holder: list[list[Check]] = []

        @tf.function
        def step() -> list[Any]:
            holder.append(build())
            return [t for _, t, _ in holder[-1]]

        values = step()
        checks = holder[-1]
    else:
        graph = tf.Graph()
        with graph.as_default():
            checks = build()
            with tf.compat.v1.Session(graph=graph) as sess:
                values = sess.run([t for _, t, _ in checks])
    for (what, _, expected), value in zip(checks, values):
        close(value, expected, f"{mode}: {what}")
    return len(checks)


def _collective_checks(me: int, n: int) -> list[Check]:
    checks: list[Check] = []
    for dtype in ALL:
        ops = [hvd.Sum, hvd.Min, hvd.Max] if dtype == tf.bool else [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
        if dtype.is_floating:
            ops.append(hvd.Average)
        for op in ops:
            for shape in [(), (0,), (3, 5)]:
                inputs = [make(r, dtype, shape) for r in range(n)]
                if op == hvd.Product:
                    inputs = [np.clip(x, 0 if dtype == tf.uint8 else -2, 2) for x in inputs]
                tag = f"allreduce {dtype.name} op={op} {shape}"
                checks.append((tag, hvd.allreduce(tf.constant(inputs[me]), op=op), reference(op, inputs)))
        rows = [make(r, dtype, (r + 1, 2), salt=1) for r in range(n)]
        checks.append((f"allgather {dtype.name}", hvd.allgather(tf.constant(rows[me])), np.concatenate(rows)))
        for root in range(n):
            vals = [make(r, dtype, (4,), salt=2) for r in range(n)]
            checks.append((f"broadcast {dtype.name} root={root}", hvd.broadcast(tf.constant(vals[me]), root), vals[root]))
        # alltoall: rank r sends (r + d) % 2 + 1 rows to rank d
        sends = {r: [(r + d) % 2 + 1 for d in range(n)] for r in range(n)}
        data = {r: make(r, dtype, (sum(sends[r]), 3), salt=3) for r in range(n)}
        out, received = hvd.alltoall(tf.constant(data[me]), splits=tf.constant(sends[me], tf.int32))
        parts = []
        for r in range(n):
            start = sum(sends[r][:me])
            parts.append(data[r][start : start + sends[r][me]])
        checks.append((f"alltoall {dtype.name}", out, np.concatenate(parts)))
        checks.append((f"alltoall splits {dtype.name}", received, np.array([sends[r][me] for r in range(n)], np.int32)))
    # alltoall without splits; reducescatter (lower ranks take the remainder); grouped ops; scale factors
    eq = [make(r, tf.float32, (2 * n, 2), salt=4) for r in range(n)]
    out, _ = hvd.alltoall(tf.constant(eq[me]))
    checks.append(("alltoall equal", out, np.concatenate([e[2 * me : 2 * me + 2] for e in eq])))
    for dtype, op in [(tf.float32, hvd.Average), (tf.int32, hvd.Sum), (tf.float64, hvd.Max)]:
        rs = [make(r, dtype, (2 * n + 1, 3), salt=5) for r in range(n)]
        total = reference(op, rs)
        counts = [(2 * n + 1) // n + (1 if i < (2 * n + 1) % n else 0) for i in range(n)]
        start = sum(counts[:me])
        got = hvd.reducescatter(tf.constant(rs[me]), op=op)
        checks.append((f"reducescatter {dtype.name} {op}", got, total[start : start + counts[me]]))
    group = [make(r, tf.float32, (3,), salt=6) for r in range(n)], [make(r, tf.int64, (2, 2), salt=7) for r in range(n)]
    outs = hvd.grouped_allreduce([tf.constant(group[0][me]), tf.constant(group[1][me])], op=hvd.Sum)
    checks.append(("grouped_allreduce f32", outs[0], reference(hvd.Sum, group[0])))
    checks.append(("grouped_allreduce i64", outs[1], reference(hvd.Sum, group[1])))
    gathered = hvd.grouped_allgather([tf.constant(group[0][me]), tf.constant(group[1][me])])
    checks.append(("grouped_allgather 0", gathered[0], np.concatenate(group[0])))
    checks.append(("grouped_allgather 1", gathered[1], np.concatenate(group[1])))
    grs = hvd.grouped_reducescatter([tf.constant(eq[me])], op=hvd.Sum)
    checks.append(("grouped_reducescatter", grs[0], reference(hvd.Sum, eq)[2 * me : 2 * me + 2]))
    scaled = hvd.allreduce(tf.constant(group[0][me]), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    checks.append(("allreduce scale factors", scaled, (reference(hvd.Sum, group[0]) * 1.5).astype(np.float32)))
    fp16 = hvd.allreduce(tf.constant(group[0][me]), compression=hvd.Compression.fp16, op=hvd.Sum)
    checks.append(("allreduce fp16 compression", fp16, reference(hvd.Sum, group[0])))
    avg = hvd.allreduce(tf.constant(group[0][me]), average=True)
    checks.append(("allreduce average=True", avg, reference(hvd.Average, group[0])))
    # IndexedSlices: values and indices are allgathered; Average divides the values by the number of ranks
    sl = hvd.allreduce(tf.IndexedSlices(tf.constant([[float(me)]]), tf.constant([me]), tf.constant([n, 1])))
    checks.append(("IndexedSlices values", sl.values, np.arange(n, dtype=np.float32).reshape(n, 1) / n))
    checks.append(("IndexedSlices indices", sl.indices, np.arange(n, dtype=np.int32)))
    checks.append(("rank_op", hvd.rank_op(), np.int32(me)))
    checks.append(("size_op", hvd.size_op(), np.int32(n)))
    checks.append(("local_rank_op", hvd.local_rank_op(), np.int32(hvd.local_rank())))
    checks.append(("local_size_op", hvd.local_size_op(), np.int32(hvd.local_size())))
    checks.append(("process_set_included_op", hvd.process_set_included_op(), np.int32(1)))
    return checks


def ops_worker(modes: list[str]) -> int:
    """Every op, dtype, reduce op and root in each of ``modes``; results never alias the inputs."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    checked = sum(run_checks(lambda: _collective_checks(me, n), mode) for mode in modes)
    # eager results are the adapter's own memory: changing an input afterwards does not change a result
    x = np.arange(4, dtype=np.float32) * (me + 1)
    src = tf.Variable(x)
    y = hvd.allreduce(src.read_value(), op=hvd.Sum)
    src.assign(tf.zeros(4))
    close(y.numpy(), np.arange(4, dtype=np.float32) * sum(range(1, n + 1)), "result independent of input")
    v = tf.Variable(np.full(3, float(me), np.float32))
    hvd.broadcast_(v, root_rank=n - 1)
    close(v.numpy(), np.full(3, float(n - 1), np.float32), "broadcast_ in place")
    hvd.barrier()
    assert int(hvd.join()) in range(n)
    assert hvd.broadcast_object({"me": me}, root_rank=0) == {"me": 0}
    assert hvd.allgather_object(me) == list(range(n))
    assert hvd.broadcast_object_fn(root_rank=n - 1)(("x", me)) == ("x", n - 1)
    assert not hvd.mpi_built() and not hvd.nccl_built() and hvd._executing_eagerly()
    return checked
