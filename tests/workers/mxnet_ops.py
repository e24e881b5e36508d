"""Worker functions for the hora.mxnet tests (they run in the MXNet environment, .venv-mxnet): every op and dtype
against numpy references of what every rank contributed (each rank can rebuild any rank's input from its rank),
errors on every rank, process sets, and DistributedTrainer / DistributedOptimizer training on digits."""

from __future__ import annotations

import hashlib
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

import hora.mxnet as hvd
from hora.errors import MismatchError, UnsupportedError
from hora.mxnet import bridge

DTYPES = ["float16", "float32", "float64", "uint8", "int8", "int32", "int64", "bool"]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def make(rank: int, dtype: str, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    """Small exact values (integers a float16 holds exactly, products included) that differ per rank."""
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    low = 0 if dtype == "uint8" else -3
    return rng.integers(low, 4, shape).astype(dtype)


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
    if np.issubdtype(dtype, np.integer):
        out = np.trunc(out)
    return out.astype(dtype)


def nd(arr: np.ndarray) -> Any:
    return mx.nd.array(arr, dtype=arr.dtype)


def same(actual: Any, expected: np.ndarray, what: str) -> None:
    assert isinstance(actual, mx.nd.NDArray), f"{what}: got {type(actual).__name__}, not an NDArray"
    got = actual.asnumpy()
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if got.dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-3, err_msg=what)
    elif np.issubdtype(got.dtype, np.floating):
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=what)
    else:
        assert np.array_equal(got, expected), f"{what}: {got} != {expected}"


def _reductions(me: int, n: int, dtype: str) -> int:
    checked = 0
    shape = (3, 4)
    everyone = [make(r, dtype, shape) for r in range(n)]
    ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product] if dtype == "bool" else OPS
    for op in ops:
        x = nd(everyone[me])
        out = hvd.allreduce(x, op=op, name=f"ar.{dtype}.{op}")
        same(out, reference(op, everyone), f"allreduce {dtype} op={op}")
        same(x, everyone[me], f"allreduce {dtype} left its input alone")
        y = nd(everyone[me])
        assert hvd.allreduce_(y, op=op) is y
        same(y, reference(op, everyone), f"allreduce_ {dtype} op={op}")
        checked += 2
    if dtype != "bool":
        same(hvd.allreduce(nd(everyone[me])), reference(hvd.Average, everyone), f"allreduce {dtype} default")
        same(hvd.allreduce(nd(everyone[me]), average=False), reference(hvd.Sum, everyone), f"{dtype} average=False")
        twice = [make(r, dtype, (2, 5), salt=1) for r in range(n)]
        outs = hvd.grouped_allreduce([nd(everyone[me]), nd(twice[me])], op=hvd.Sum)
        same(outs[0], reference(hvd.Sum, everyone), f"grouped_allreduce {dtype} [0]")
        same(outs[1], reference(hvd.Sum, twice), f"grouped_allreduce {dtype} [1]")
        ins = [nd(everyone[me]), nd(twice[me])]
        assert hvd.grouped_allreduce_(ins, op=hvd.Max) == ins
        same(ins[0], reference(hvd.Max, everyone), f"grouped_allreduce_ {dtype} [0]")
        same(ins[1], reference(hvd.Max, twice), f"grouped_allreduce_ {dtype} [1]")
        rows = [make(r, dtype, (2 * n + 1, 3), salt=2) for r in range(n)]
        full = reference(hvd.Sum, rows)
        counts = [(2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0) for r in range(n)]
        start = sum(counts[:me])
        same(hvd.reducescatter(nd(rows[me]), op=hvd.Sum), full[start : start + counts[me]], f"reducescatter {dtype}")
        got = hvd.grouped_reducescatter([nd(rows[me]), nd(rows[me])], op=hvd.Sum)
        same(got[1], full[start : start + counts[me]], f"grouped_reducescatter {dtype}")
        checked += 6
    return checked


def _movement(me: int, n: int, dtype: str) -> int:
    checked = 0
    parts = [make(r, dtype, (r + 1, 3), salt=3) for r in range(n)]
    same(hvd.allgather(nd(parts[me])), np.concatenate(parts), f"allgather {dtype}")
    got = hvd.grouped_allgather([nd(parts[me]), nd(parts[me][:, :1])])
    same(got[1], np.concatenate([p[:, :1] for p in parts]), f"grouped_allgather {dtype}")
    checked += 2
    for root in range(n):
        values = [make(r, dtype, (2, 3), salt=4 + root) for r in range(n)]
        x = nd(values[me])
        same(hvd.broadcast(x, root), values[root], f"broadcast {dtype} root={root}")
        same(x, values[me], f"broadcast {dtype} left its input alone")
        assert hvd.broadcast_(x, root_rank=root) is x
        same(x, values[root], f"broadcast_ {dtype} root={root}")
        checked += 2
    # alltoall: rank r sends r + 1 + j rows to rank j
    sends = [[r + 1 + j for j in range(n)] for r in range(n)]
    data = [make(r, dtype, (sum(sends[r]), 2), salt=5) for r in range(n)]
    out, received = hvd.alltoall(nd(data[me]), splits=sends[me])
    chunks = []
    for r in range(n):
        offset = sum(sends[r][:me])
        chunks.append(data[r][offset : offset + sends[r][me]])
    same(out, np.concatenate(chunks), f"alltoall {dtype}")
    same(received, np.array([sends[r][me] for r in range(n)], np.int32), f"alltoall {dtype} received")
    even = [make(r, dtype, (2 * n, 2), salt=6) for r in range(n)]
    same(hvd.alltoall(nd(even[me])), np.concatenate([e[2 * me : 2 * me + 2] for e in even]), f"alltoall {dtype} even")
    return checked + 2


def ops_worker(dtypes: list[str] = DTYPES) -> int:
    """Every op on every dtype against numpy; returns how many results were compared."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    checked = sum(_reductions(me, n, dt) + _movement(me, n, dt) for dt in dtypes)
    checked += _no_aliasing(me, n)
    checked += _other_kinds(me, n)
    hvd.barrier()
    return checked


def _no_aliasing(me: int, n: int) -> int:
    """Results are the caller's: a later collective (recycling the engine's buffers) does not change them."""
    big = ((32 << 20) // 4 + 1,)  # results past 32 MiB: the engine recycles such buffers once nothing holds them
    first = hvd.allgather(mx.nd.full(big, me + 1.0))
    second = hvd.allgather(mx.nd.full(big, me + 10.0))
    expected = np.concatenate([np.full(big, r + 1.0, np.float32) for r in range(n)])
    same(first, expected, "the first allgather's result after a second allgather")
    assert second.asnumpy()[0] == 10.0
    x = mx.nd.full((4,), me + 1.0)
    out = hvd.allreduce(x, op=hvd.Sum)
    out[:] = -1
    same(x, np.full(4, me + 1.0, np.float32), "allreduce's output does not share memory with its input")
    return 2


def _other_kinds(me: int, n: int) -> int:
    """mx.np arrays come back as mx.np arrays; lazily computed inputs are waited for; objects; join."""
    a = mx.np.ones((2, 2)) * (me + 1)
    out = hvd.allreduce(a, op=hvd.Sum)
    assert isinstance(out, mx.np.ndarray), type(out)
    np.testing.assert_array_equal(out.asnumpy(), np.full((2, 2), n * (n + 1) / 2))
    lazy = mx.nd.dot(mx.nd.ones((64, 64)), mx.nd.ones((64, 64))) * (me + 1)  # pushed to MXNet's engine
    same(hvd.allreduce(lazy, op=hvd.Sum), np.full((64, 64), 64.0 * n * (n + 1) / 2, np.float32), "lazy input")
    bf16 = mx.nd.array(np.arange(4) + me).astype(bridge.MX_BFLOAT16)  # MXNet's bfloat16 NDArray
    got = hvd.allreduce(bf16, op=hvd.Sum)
    assert got.dtype == bridge.MX_BFLOAT16, got.dtype
    expected = sum(np.arange(4) + r for r in range(n)).astype(np.float32)
    np.testing.assert_array_equal(got.astype("float32").asnumpy(), expected)
    assert hvd.broadcast_object({"rank": me}, root_rank=n - 1) == {"rank": n - 1}
    assert hvd.allgather_object(me * 2) == [r * 2 for r in range(n)]
    # join: the last rank joins late; the others' allreduces meanwhile count its contribution as zeros
    if me == n - 1 and n > 1:
        same(hvd.allreduce(mx.nd.ones((3,)), op=hvd.Sum, name="after-join"), np.ones(3, np.float32), "joined zeros")
    last = hvd.join()
    assert last == n - 1, last
    return 5


def _expect(error: type[BaseException], fn: Any, notes: list[str], what: str) -> None:
    try:
        fn()
    except error as exc:
        notes.append(f"{what}: {type(exc).__name__}: {exc}")
        return
    raise AssertionError(f"{what}: expected {error.__name__}, nothing was raised")


def errors_worker() -> list[str]:
    """Bad input raises on every rank with a message naming the operation; the ranks carry on afterwards."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    notes: list[str] = []
    _expect(MismatchError, lambda: hvd.allreduce(mx.nd.ones((2, me + 1)), name="grad.fc1"), notes, "shape")
    dtype = "float32" if me == 0 else "float64"
    _expect(MismatchError, lambda: hvd.allreduce(mx.nd.ones((2,), dtype=dtype), name="grad.b"), notes, "dtype")
    _expect(MismatchError, lambda: hvd.broadcast(mx.nd.ones((2,)), root_rank=me, name="bc"), notes, "root")
    _expect(ValueError, lambda: hvd.reducescatter(mx.nd.ones((2,)), op=hvd.Max), notes, "reducescatter op")
    sparse = mx.nd.ones((4, 2)).tostype("row_sparse")
    _expect(UnsupportedError, lambda: hvd.allreduce(sparse), notes, "sparse")
    _expect(TypeError, lambda: hvd.allreduce(np.ones(2)), notes, "numpy input")
    _expect(ValueError, lambda: hvd.broadcast(mx.nd.ones((2,)), root_rank=n), notes, "root out of range")
    _expect(MXNetError, lambda: hvd.alltoall(mx.nd.ones((3,)), splits=[3] * n), notes, "alltoall splits")
    floats = mx.nd.ones((n,), dtype="float32")  # Horovod takes int32 splits only (a list is cast to int32)
    _expect(MXNetError, lambda: hvd.alltoall(mx.nd.ones((n,)), splits=floats), notes, "alltoall float splits")
    _expect(MXNetError, lambda: hvd.alltoall(mx.nd.ones((n + 1,))), notes, "alltoall uneven")
    _expect(ValueError, lambda: hvd.allreduce(mx.nd.ones((2,)), average=True, op=hvd.Sum), notes, "average and op")
    _expect(UnsupportedError, lambda: hvd.allreduce(mx.nd.ones((2,), dtype="int32"), op=hvd.Adasum), notes, "adasum")
    _expect(ValueError, lambda: hvd.broadcast_parameters([mx.nd.ones(1)]), notes, "broadcast_parameters list")
    dense = mx.gluon.nn.Dense(2, in_units=3)
    dense.initialize()
    _expect(
        UnsupportedError,
        lambda: hvd.DistributedTrainer(dense.collect_params(), "sgd", strategy="parameter_server"),
        notes,
        "trainer strategy",
    )
    _expect(
        UnsupportedError,
        lambda: hvd.DistributedOptimizer(mx.optimizer.SGD(), strategy="hybrid"),
        notes,
        "optimizer strategy",
    )
    # still working afterwards
    same(hvd.allreduce(mx.nd.ones((2,)), op=hvd.Sum), np.full(2, n, np.float32), "allreduce after the errors")
    return notes


def process_sets_worker() -> list[str]:
    """A process set of the even ranks: its members reduce among themselves; a non-member's call raises."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    members = list(range(0, n, 2))
    evens = hvd.add_process_set(hvd.ProcessSet(members))
    notes: list[str] = []
    if me % 2 == 0:
        got = hvd.allreduce(mx.nd.full((2,), me), op=hvd.Sum, process_set=evens)
        same(got, np.full(2, sum(range(0, n, 2)), np.float32), "allreduce in the set")
        root = members[-1]
        got = hvd.broadcast(mx.nd.full((2,), me), root_rank=root, process_set=evens)
        same(got, np.full(2, root, np.float32), "broadcast in the set")
        gathered = hvd.allgather(mx.nd.full((1,), me), process_set=evens)
        same(gathered, np.arange(0, n, 2).astype(np.float32), "allgather in the set")
    else:
        _expect(Exception, lambda: hvd.allreduce(mx.nd.ones((2,)), process_set=evens), notes, "non-member")
    # A trainer on the set: its members average their gradients; the other ranks skip the allreduce but keep the
    # gradient scale divided by the set's size, as Horovod's trainer does.
    from mxnet import autograd, gluon

    dense = gluon.nn.Dense(1, in_units=2, use_bias=False)
    dense.initialize(mx.init.Constant(0.0))
    trainer = hvd.DistributedTrainer(dense.collect_params(), "sgd", {"learning_rate": 1.0}, process_set=evens)
    with autograd.record():
        loss = dense(mx.nd.full((1, 2), me + 1.0)).sum()
    loss.backward()
    trainer.step(1)
    got = dense.weight.data().asnumpy().ravel().tolist()
    mean = float(np.mean([r + 1.0 for r in members]))
    assert got == ([-mean] * 2 if me in members else [-(me + 1.0) / len(members)] * 2), (me, got)
    hvd.remove_process_set(evens)
    hvd.barrier()
    return notes


# -- training ------------------------------------------------------------------------------------------------------
def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return train_test_split(x, y.astype(np.float32), test_size=0.2, random_state=0)


def _model() -> Any:
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, kernel_size=3, padding=1, activation="relu"))
        net.add(gluon.nn.MaxPool2D(pool_size=2))
        net.add(gluon.nn.Flatten())
        net.add(gluon.nn.Dense(32, activation="relu"))
        net.add(gluon.nn.Dense(10))
    return net


def _weights_digest(params: Any) -> str:
    h = hashlib.sha256()
    for name, p in sorted(params.items()):
        h.update(name.encode())
        h.update(p.data().asnumpy().tobytes())
    return h.hexdigest()


def train_worker(epochs: int = 4, global_batch: int = 64, options: dict | None = None) -> dict[str, Any]:
    """Train the CNN with DistributedTrainer. Each global batch of ``global_batch`` rows (the same batches, in the
    same order, as one process would take) is split over the ranks in order, so N ranks compute what one computes
    up to float rounding. Every rank starts from different random weights: broadcast_parameters (deferred) makes
    rank 0's the start."""
    from mxnet import autograd, gluon

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    options = dict(options or {})
    xt, xv, yt, yv = _digits()
    local = global_batch // n
    mx.random.seed(me)
    net = _model()
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "adam", {"learning_rate": 0.01}, **options)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps = len(xt) // global_batch
    for _ in range(epochs):
        for s in range(steps):
            lo = s * global_batch + me * local
            data, label = mx.nd.array(xt[lo : lo + local]), mx.nd.array(yt[lo : lo + local])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(local)
    pred = net(mx.nd.array(xv)).argmax(axis=1).asnumpy()
    return {"accuracy": float(np.mean(pred == yv)), "weights": _weights_digest(params)}


def optimizer_worker(predivide: float = 1.0) -> list[float]:
    """DistributedOptimizer (through mx.optimizer's Updater, as mx.mod.Module uses it): the update sees the
    average of the ranks' gradients."""
    hvd.init()
    me = hvd.rank()
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.5), gradient_predivide_factor=predivide)
    updater = mx.optimizer.get_updater(opt)
    weight = mx.nd.ones((3,))
    grad = mx.nd.array([me + 1.0, 2.0 * (me + 1), 0.0])
    updater(0, grad, weight)
    weights = [mx.nd.ones((2,)), mx.nd.zeros((2,))]
    grads = [mx.nd.full((2,), me + 1.0), mx.nd.full((2,), 2.0)]
    updater([1, 2], grads, weights)  # the aggregated form (lists of indices)
    return [*weight.asnumpy().tolist(), *weights[0].asnumpy().tolist(), *weights[1].asnumpy().tolist()]


def suite_worker(parts: list[str]) -> dict[str, Any]:
    """Several parts in one run (MXNet costs a second to import in every rank)."""
    out: dict[str, Any] = {}
    for part in parts:
        name, _, arg = part.partition(":")
        if name == "ops":
            out[part] = ops_worker()
        elif name == "errors":
            out[part] = errors_worker()
        elif name == "sets":
            out[part] = process_sets_worker()
        elif name == "optimizer":
            out[part] = optimizer_worker(float(arg or 1.0))
        elif name == "train":
            out[part] = train_worker(options=_TRAIN_OPTIONS[arg or "plain"])
    hvd.shutdown()
    return out


_TRAIN_OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "predivide": {"gradient_predivide_factor": 2.0, "prefix": "model."},
    "groups": {"num_groups": 2},
    "fp16": {"compression": hvd.Compression.fp16},
}
