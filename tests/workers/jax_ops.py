"""Worker functions for the hora.jax tests. Each check is built once eagerly and once inside one ``jax.jit``
function, compared with a numpy computation of what every rank contributed (each rank can rebuild any other rank's
input from its rank), and the two modes must agree bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)  # int64 and float64 arrays stay 64-bit (JAX's default makes them 32)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hora.jax as hvd  # noqa: E402
from hora.errors import MismatchError, UnsupportedError  # noqa: E402

FLOATS = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64]
INTS = [jnp.uint8, jnp.int8, jnp.int16, jnp.int32, jnp.int64]
ALL = [np.dtype(d) for d in [*FLOATS, *INTS, jnp.bool_]]

Check = tuple[str, Any, Any]  # (what, array built by hora, expected numpy value)


def make(rank: int, dtype: np.dtype, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    """Small exact values (integers a float16 holds exactly) that differ per rank."""
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0 if dtype == np.uint8 else -5, 6, shape).astype(dtype)


def reference(op: int, arrays: list[np.ndarray]) -> np.ndarray:
    if arrays[0].dtype == np.bool_:
        stack = np.stack(arrays)
        return stack.all(0) if op in (hvd.Min, hvd.Product) else stack.any(0)
    stack = np.stack([a.astype(np.float64) for a in arrays])
    out = {hvd.Sum: stack.sum(0), hvd.Average: stack.sum(0) / len(arrays), hvd.Min: stack.min(0),
           hvd.Max: stack.max(0), hvd.Product: stack.prod(0)}[op]  # fmt: skip
    return out.astype(arrays[0].dtype)


def close(actual: Any, expected: np.ndarray, what: str) -> None:
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind == "f" or expected.dtype.name == "bfloat16":
        tol = 1e-2 if expected.dtype.itemsize == 2 else 1e-6
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol, err_msg=what)
    else:
        assert np.array_equal(actual, expected), f"{what}: {actual} != {expected}"


def run_both(build: Callable[[bool], list[Check]]) -> int:
    """``build`` eagerly and inside one jitted function; every value is checked in both and must be equal."""
    eager = build(False)
    holder: list[list[Check]] = []

    @jax.jit
    def traced() -> list[Any]:
        holder.append(build(True))
        return [t for _, t, _ in holder[-1]]

    jitted = traced()
    assert [w for w, _, _ in holder[-1]] == [w for w, _, _ in eager]
    for (what, value, expected), j in zip(eager, jitted):
        close(value, expected, f"eager: {what}")
        close(j, expected, f"jit: {what}")
        assert np.asarray(value).tobytes() == np.asarray(j).tobytes(), f"{what}: eager and jit differ"
    return len(eager)


def _collective_checks(me: int, n: int, jit: bool) -> list[Check]:
    checks: list[Check] = []
    for dtype in ALL:
        ops = [hvd.Sum, hvd.Min, hvd.Max] if dtype == np.bool_ else [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
        if dtype.kind == "f" or dtype.name == "bfloat16":
            ops.append(hvd.Average)
        for op in ops:
            for shape in [(), (0,), (3, 5)]:
                inputs = [make(r, dtype, shape) for r in range(n)]
                if op == hvd.Product:
                    inputs = [np.clip(x, 0 if dtype == np.uint8 else -2, 2) for x in inputs]
                tag = f"allreduce {dtype.name} op={op} {shape}"
                checks.append((tag, hvd.allreduce(jnp.asarray(inputs[me]), op=op), reference(op, inputs)))
        rows = [make(r, dtype, (2, 2), salt=1) for r in range(n)]  # equal counts: traced shapes are static
        checks.append((f"allgather {dtype.name}", hvd.allgather(jnp.asarray(rows[me])), np.concatenate(rows)))
        for root in range(n):
            vals = [make(r, dtype, (4,), salt=2) for r in range(n)]
            checks.append((f"broadcast {dtype.name} root={root}", hvd.broadcast(jnp.asarray(vals[me]), root), vals[root]))
        eq = [make(r, dtype, (2 * n, 3), salt=3) for r in range(n)]
        checks.append((f"alltoall {dtype.name}", hvd.alltoall(jnp.asarray(eq[me])),
                       np.concatenate([e[2 * me : 2 * me + 2] for e in eq])))  # fmt: skip
        op = hvd.Max if dtype == np.bool_ else hvd.Sum
        checks.append((f"reducescatter {dtype.name}", hvd.reducescatter(jnp.asarray(eq[me]), op=op),
                       reference(op, eq)[2 * me : 2 * me + 2]))  # fmt: skip
    for dtype, op in [(np.float32, hvd.Average), (np.int32, hvd.Sum), (np.float64, hvd.Max), (np.int8, hvd.Min)]:
        rs = [make(r, np.dtype(dtype), (2 * n + 1, 3), salt=5) for r in range(n)]
        total = reference(op, rs)
        counts = [(2 * n + 1) // n + (1 if i < (2 * n + 1) % n else 0) for i in range(n)]
        start = sum(counts[:me])
        got = hvd.reducescatter(jnp.asarray(rs[me]), op=op)
        checks.append((f"reducescatter {np.dtype(dtype).name} {op}", got, total[start : start + counts[me]]))
    group = [make(r, np.dtype(np.float32), (3,), salt=6) for r in range(n)], [make(r, np.dtype(np.int64), (2, 2), salt=7) for r in range(n)]
    outs = hvd.grouped_allreduce([jnp.asarray(group[0][me]), jnp.asarray(group[1][me])], op=hvd.Sum)
    checks.append(("grouped_allreduce f32", outs[0], reference(hvd.Sum, group[0])))
    checks.append(("grouped_allreduce i64", outs[1], reference(hvd.Sum, group[1])))
    gathered = hvd.grouped_allgather([jnp.asarray(group[0][me]), jnp.asarray(group[1][me])])
    checks.append(("grouped_allgather 0", gathered[0], np.concatenate(group[0])))
    checks.append(("grouped_allgather 1", gathered[1], np.concatenate(group[1])))
    eq = [make(r, np.dtype(np.float32), (2 * n, 2), salt=4) for r in range(n)]
    grs = hvd.grouped_reducescatter([jnp.asarray(eq[me]), jnp.asarray(eq[me] * 2)], op=hvd.Sum)
    checks.append(("grouped_reducescatter 0", grs[0], reference(hvd.Sum, eq)[2 * me : 2 * me + 2]))
    checks.append(("grouped_reducescatter 1", grs[1], 2 * reference(hvd.Sum, eq)[2 * me : 2 * me + 2]))
    scaled = hvd.allreduce(jnp.asarray(group[0][me]), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    checks.append(("allreduce scale factors", scaled, (reference(hvd.Sum, group[0]) * 1.5).astype(np.float32)))
    fp16 = hvd.allreduce(jnp.asarray(group[0][me]), compression=hvd.Compression.fp16, op=hvd.Sum)
    checks.append(("allreduce fp16 compression", fp16, reference(hvd.Sum, group[0])))
    avg = hvd.allreduce(jnp.asarray(group[0][me]), average=True)
    checks.append(("allreduce average=True", avg, reference(hvd.Average, group[0])))
    params = {"w": jnp.asarray(make(me, np.dtype(np.float32), (2, 3), salt=8)), "b": [jnp.asarray(np.int32(me))]}
    got = hvd.broadcast_parameters(params, root_rank=n - 1)
    checks.append(("broadcast_parameters w", got["w"], make(n - 1, np.dtype(np.float32), (2, 3), salt=8)))
    checks.append(("broadcast_parameters b", got["b"][0], np.int32(n - 1)))
    return checks


def _eager_only(me: int, n: int) -> int:
    """allgather of different row counts and alltoall with uneven splits (eagerly only: inside a trace the shapes
    would not be static)."""
    checked = 0
    for dtype in ALL:
        rows = [make(r, dtype, (r + 1, 2), salt=1) for r in range(n)]
        close(hvd.allgather(jnp.asarray(rows[me])), np.concatenate(rows), f"allgather uneven {dtype.name}")
        sends = {r: [(r + d) % 2 + 1 for d in range(n)] for r in range(n)}
        data = {r: make(r, dtype, (sum(sends[r]), 3), salt=3) for r in range(n)}
        out, received = hvd.alltoall(jnp.asarray(data[me]), splits=sends[me])
        parts = [data[r][sum(sends[r][:me]) : sum(sends[r][:me]) + sends[r][me]] for r in range(n)]
        close(out, np.concatenate(parts), f"alltoall splits {dtype.name}")
        close(received, np.array([sends[r][me] for r in range(n)], np.int32), "received splits")
        checked += 3
    return checked


def ops_part(me: int, n: int) -> int:
    """Every op, dtype, reduce op and root, eagerly and jitted; results never alias the inputs; the rest."""
    checked = run_both(lambda jit: _collective_checks(me, n, jit)) + _eager_only(me, n)
    # a result is a new array: a numpy input changed afterwards does not change it (the eager path views inputs)
    x = np.arange(4, dtype=np.float32) * (me + 1)
    y = hvd.allreduce(x, op=hvd.Sum)
    x[:] = -1
    close(y, np.arange(4, dtype=np.float32) * sum(range(1, n + 1)), "result independent of input")
    assert isinstance(y, jax.Array)
    hvd.barrier()
    assert int(hvd.join()) in range(n)
    assert hvd.broadcast_object({"me": me}, root_rank=n - 1) == {"me": n - 1}
    assert hvd.allgather_object(me) == list(range(n))

    @jax.jit
    def ordered(x):  # barrier and join inside jit
        hvd.barrier()
        return hvd.join() + x.sum()

    assert int(ordered(jnp.ones(2))) - 2 in range(n)

    @jax.jit
    def unused(x):  # the allreduce's result is dropped: it must run all the same
        hvd.allreduce(x, name="unused", op=hvd.Sum)
        return x + 1

    # Rank 0 drops the result inside jit, the others use theirs eagerly: had XLA eliminated rank 0's callback, the
    # others would wait for it forever (the harness's time limit would fail the test).
    if me == 0:
        close(unused(jnp.ones(2)), np.full(2, 2.0), "unused: the function's own result")
    else:
        close(hvd.allreduce(jnp.ones(2), name="unused", op=hvd.Sum), np.full(2, float(n)), "unused, eagerly")
    assert not hvd.mpi_built() and not hvd.nccl_built()
    return checked + 6


def _grad_checks(me: int, n: int) -> list[Check]:
    f32 = np.float32
    x = jnp.asarray(np.arange(3, dtype=f32) + me)
    w_np = np.array([1.0, 2.0, 3.0], f32)
    w = jnp.asarray(w_np)
    checks: list[Check] = [
        ("allreduce Sum grad", jax.grad(lambda t: jnp.sum(hvd.allreduce(t, op=hvd.Sum) * w))(x), n * w_np),
        ("allreduce Average grad", jax.grad(lambda t: jnp.sum(hvd.allreduce(t) * w))(x), w_np),
    ]
    rows = jnp.ones((2, 2), f32)
    weights = np.arange(n * 4, dtype=f32).reshape(-1, 2)
    checks.append((
        "allgather grad",
        jax.grad(lambda t: jnp.sum(hvd.allgather(t * (me + 1)) * weights))(rows),
        n * weights[2 * me : 2 * me + 2] * (me + 1),
    ))  # fmt: skip
    root = n - 1
    checks.append((
        "broadcast grad",
        jax.grad(lambda t: jnp.sum(hvd.broadcast(t, root) * w))(x),
        (n * w_np) if me == root else np.zeros(3, f32),
    ))  # fmt: skip
    data = jnp.ones((n, 2), f32)
    checks.append((
        "alltoall grad",
        jax.grad(lambda t: jnp.sum(hvd.alltoall(t) * (me + 1)))(data),
        np.repeat(np.arange(1, n + 1, dtype=f32), 2).reshape(n, 2),
    ))  # fmt: skip
    scatter = jnp.ones((2 * n, 2), f32)
    checks.append((
        "reducescatter grad",
        jax.grad(lambda t: jnp.sum(hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0) * (me + 1)))(scatter),
        2 * np.repeat(np.arange(1, n + 1, dtype=f32), 4).reshape(2 * n, 2),
    ))  # fmt: skip
    pair = jax.grad(lambda a, b: jnp.sum(hvd.grouped_allreduce([a, b], op=hvd.Sum)[0] * w), argnums=(0, 1))
    ga, gb = pair(x, jnp.ones(2, f32))
    checks.append(("grouped_allreduce grad 0", ga, n * w_np))
    checks.append(("grouped_allreduce grad 1", gb, np.zeros(2, f32)))
    return checks


def gradients_part(me: int, n: int) -> int:
    """Horovod's gradients through jax.grad, eagerly and inside jit (the same values)."""
    return run_both(lambda _jit: _grad_checks(me, n))


def _error(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except Exception as exc:  # the test compares the type and message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def errors_part(me: int, n: int) -> list[str]:
    """Each error, as every rank sees it; the job goes on after every one of them."""
    bad = jnp.zeros((2, 2 + me), jnp.float32)
    notes = [
        _error(lambda: hvd.allreduce(bad, name="eager.shape")),
        _error(lambda: jax.jit(lambda t: hvd.allreduce(t, name="jit.shape"))(bad).block_until_ready()),
        _error(lambda: hvd.allreduce(jnp.zeros(2, jnp.complex64))),
        _error(lambda: hvd.allreduce(jnp.zeros(2, jnp.int32), op=hvd.Adasum)),  # Adasum: floats only
        _error(lambda: hvd.allreduce(jnp.zeros(2, bool), op=hvd.Average)),
        _error(lambda: jax.vmap(lambda t: hvd.allreduce(t))(jnp.zeros((3, 2)))),
        _error(lambda: jax.jit(jax.vmap(lambda t: hvd.allreduce(t)))(jnp.zeros((3, 2)))),
        _error(lambda: jax.jit(lambda t: hvd.allgather(t))(jnp.zeros((me + 1, 2))).block_until_ready()),
        _error(lambda: jax.jit(lambda t: hvd.alltoall(t, splits=[1] * n))(jnp.zeros((n, 2)))),
        _error(lambda: jax.vmap(jax.jit(lambda t: hvd.allreduce(t)))(jnp.zeros((3, 2)))),
        _error(lambda: jax.pmap(lambda t: hvd.allreduce(t))(jnp.zeros((1, 2)))),
        _error(lambda: jax.jit(jax.shard_map(lambda t: hvd.allreduce(t), mesh=jax.make_mesh((1,), ("d",)),
                                             in_specs=jax.P(), out_specs=jax.P()))(jnp.zeros(2))),
    ]
    assert isinstance(MismatchError("x"), hvd.HorovodInternalError) and issubclass(UnsupportedError, Exception)
    # the job is healthy afterwards
    close(hvd.allreduce(jnp.ones(2), op=hvd.Sum), np.full(2, float(n)), "after errors")
    return notes


def process_sets_part(me: int, n: int) -> list[str]:
    """Two disjoint sets (even and odd ranks): collectives within each, eagerly and jitted; a non-member's call
    is a clear error."""
    evens, odds = hvd.ProcessSet(list(range(0, n, 2))), hvd.ProcessSet(list(range(1, n, 2)))
    hvd.add_process_set(evens)
    hvd.add_process_set(odds)
    mine, other = (evens, odds) if me % 2 == 0 else (odds, evens)
    want = float(sum(r for r in mine.ranks))
    got = hvd.allreduce(jnp.asarray([float(me)]), op=hvd.Sum, process_set=mine)
    close(got, np.array([want]), "process set eager")
    jitted = jax.jit(lambda t: hvd.allgather(t, process_set=mine))(jnp.asarray([me]))
    close(jitted, np.asarray(mine.ranks, np.int64), "process set jit allgather")
    root = mine.ranks[-1]
    close(hvd.broadcast(jnp.asarray([me]), root, process_set=mine), np.asarray([root]), "process set broadcast")
    notes = [_error(lambda: hvd.allreduce(jnp.ones(1), process_set=other))]
    hvd.barrier()
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)
    return notes


def optimizer_part(me: int, n: int) -> dict[str, Any]:
    """DistributedOptimizer: one grouped reduction per step; backward_passes_per_step=2 like optax.MultiSteps."""
    import optax

    params = {"a": jnp.ones(3, jnp.float32), "b": jnp.ones((2, 2), jnp.float32)}
    grads = {"a": jnp.full(3, float(me + 1), jnp.float32), "b": jnp.full((2, 2), float(me), jnp.float32)}
    opt = hvd.DistributedOptimizer(optax.sgd(1.0))
    upd, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    mean_a, mean_b = (n + 1) / 2, (n - 1) / 2
    close(upd["a"], np.full(3, -mean_a, np.float32), "DistributedOptimizer average")
    close(upd["b"], np.full((2, 2), -mean_b, np.float32), "DistributedOptimizer average b")
    multi = hvd.DistributedOptimizer(optax.sgd(1.0), backward_passes_per_step=2, average_aggregated_gradients=True)
    state = multi.init(params)
    step = jax.jit(multi.update)
    u1, state = step(grads, state, params)
    close(u1["a"], np.zeros(3, np.float32), "first pass: no update")
    twice = jax.tree_util.tree_map(lambda g: g * 3, grads)
    u2, state = step(twice, state, params)
    close(u2["a"], np.full(3, -2 * mean_a, np.float32), "second pass: the mean of the passes, averaged")
    assert int(state.mini_step) == 0
    summed = hvd.DistributedOptimizer(optax.sgd(1.0), backward_passes_per_step=2)  # Horovod's default: the sum
    s = summed.init(params)
    _, s = summed.update(grads, s, params)  # eager update works too
    u, s = summed.update(grads, s, params)
    close(u["a"], np.full(3, -2 * mean_a, np.float32), "sum of the passes")
    pre = hvd.DistributedOptimizer(optax.sgd(1.0), gradient_predivide_factor=2.0)
    close(pre.update(grads, pre.init(params), params)[0]["a"], np.full(3, -mean_a, np.float32), "predivide")
    # groups: an int splits the leaves (pytree order) into grouped allreduces; lists of params leaves are explicit
    three = {**params, "c": jnp.zeros(2, jnp.float32)}
    grads3 = {**grads, "c": jnp.full(2, 2.0 * me, jnp.float32)}
    for groups in (2, [[three["c"], three["a"]]]):
        grouped = hvd.DistributedOptimizer(optax.sgd(1.0), groups=groups, name=f"grouped.{type(groups).__name__}")
        u, _ = jax.jit(grouped.update)(grads3, grouped.init(three), three)
        close(u["a"], np.full(3, -mean_a, np.float32), f"groups={groups!r} a")
        close(u["b"], np.full((2, 2), -mean_b, np.float32), f"groups={groups!r} b")
        close(u["c"], np.full(2, -2 * mean_b, np.float32), f"groups={groups!r} c")
    # Adasum: every rank's Adam step (from its own gradients) first, then the steps combined (Horovod's order)
    from workers.collectives import adasum_reference

    def rank_grads(r: int) -> dict[str, Any]:
        return {"a": jnp.array([r + 1.0, -1.0, 2.0 * r], jnp.float32), "b": jnp.full((2, 2), r - 0.5, jnp.float32)}

    ada = hvd.DistributedOptimizer(optax.adam(0.1), op=hvd.Adasum, name="adasum")
    got, _ = jax.jit(ada.update)(rank_grads(me), ada.init(params), params)
    steps = [optax.adam(0.1).update(rank_grads(r), optax.adam(0.1).init(params), params)[0] for r in range(n)]
    for leaf in ("a", "b"):
        want = adasum_reference([np.asarray(s[leaf], np.float64) for s in steps])
        close(got[leaf], want.astype(np.float32), f"Adasum optimizer {leaf}")
    stranger = hvd.DistributedOptimizer(optax.sgd(1.0), groups=[[jnp.ones(3)]])
    return {
        "checked": 8,
        "errors": [
            _error(
                lambda: hvd.DistributedOptimizer(optax.sgd(1.0), op=hvd.Sum, gradient_predivide_factor=2.0)
            ),
            _error(lambda: hvd.DistributedOptimizer(optax.sgd(1.0), op=hvd.Adasum, gradient_predivide_factor=2.0)),
            _error(lambda: hvd.DistributedOptimizer(optax.sgd(1.0), strategy="parameter_server")),
            _error(lambda: stranger.init(params)),
        ],
    }


def train_part(me: int, n: int) -> dict[str, Any]:
    """examples/jax_digits.py's training, in this rank: accuracy and a digest of the weights."""
    import jax_digits  # examples/ is on sys.path (suite_worker)

    args = jax_digits.parse_args(["--epochs", "4", "--seed", "0"])
    accuracy, params = jax_digits.train(args, log=False)
    return {"accuracy": accuracy, "digest": jax_digits.digest(params)}


def keras_part(me: int, n: int) -> dict[str, Any]:
    """Keras 3 fit with hora.keras.DistributedOptimizer on the backend KERAS_BACKEND names (jax here)."""
    from workers.keras_fit import flavour_fit_worker

    return flavour_fit_worker()


PARTS: dict[str, Callable[[int, int], Any]] = {
    "ops": ops_part, "gradients": gradients_part, "errors": errors_part, "process_sets": process_sets_part,
    "optimizer": optimizer_part, "train": train_part, "keras": keras_part,
}  # fmt: skip


def suite_worker(parts: list[str], examples: str) -> dict[str, Any]:
    """The ``parts`` in order, in one rank (JAX costs seconds to import and to compile: one run per N)."""
    import sys

    sys.path.insert(0, examples)
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    return {p: PARTS[p](me, n) for p in parts}
