"""Worker functions run on every rank by the collective tests (importable by name in the rank processes)."""

from __future__ import annotations

import itertools

import numpy as np

import hora.numpy as hvd
from hora._dtypes import DTYPES, even_counts
from hora.errors import ConfigError, MismatchError

ALL_DTYPES = list(DTYPES)
FLOATS = {"float16", "bfloat16", "float32", "float64"}
SHAPES = [(), (0,), (7,), (3, 4, 5), (70_001,)]


def data(rank: int, dtype: str, shape: tuple[int, ...], kind: str = "sum", salt: int = 0) -> np.ndarray:
    """Deterministic per-rank data whose sums and products stay exact in every dtype for up to 4 ranks."""
    rng = np.random.default_rng([rank, len(dtype), sum(shape), len(shape), salt, ord(kind[0])])
    dt = DTYPES[dtype]
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if kind == "product":
        values = rng.choice([1, 2] if dtype == "uint8" else [1, 2, -1], size=shape)
    else:
        values = rng.integers(0 if dtype == "uint8" else -5, 6, shape)
    return np.asarray(values).astype(dt)


def reference(op: int, arrays: list[np.ndarray], dtype: str, prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
    dt = DTYPES[dtype]
    n = len(arrays)
    wide = np.float64 if dtype in FLOATS else (np.bool_ if dtype == "bool" else np.int64)
    stack = np.stack([a.astype(wide) * prescale if prescale != 1.0 else a.astype(wide) for a in arrays])
    if op in (hvd.Sum, hvd.Average):
        out = stack.any(0) if dtype == "bool" else stack.sum(0)
    elif op == hvd.Min:
        out = stack.min(0)
    elif op == hvd.Max:
        out = stack.max(0)
    else:
        out = stack.all(0) if dtype == "bool" else stack.prod(0)
    if op == hvd.Average:
        postscale = postscale / n
    if postscale != 1.0:
        out = out.astype(dt) * postscale if dtype not in FLOATS else out * postscale
    return np.asarray(out).astype(dt)


def check(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert isinstance(actual, np.ndarray), f"{what}: got {type(actual)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.name in FLOATS:
        tol = 1e-2 if expected.dtype.itemsize == 2 else 1e-6
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def _ops(dtype: str) -> list[int]:
    ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
    return ops if dtype == "bool" else [*ops, hvd.Average]


def allreduce_worker() -> int:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    count = 0
    for dtype in ALL_DTYPES:
        for op in _ops(dtype):
            kind = "product" if op == hvd.Product else "sum"
            for shape in SHAPES:
                x = data(r, dtype, shape, kind)
                expected = reference(op, [data(k, dtype, shape, kind) for k in range(n)], dtype)
                check(hvd.allreduce(x, op=op), expected, f"allreduce {dtype} op={op} shape={shape}")
                count += 1
        if dtype != "bool":  # scale factors, and the in-place variant
            x = data(r, dtype, (5, 3))
            expected = reference(hvd.Sum, [data(k, dtype, (5, 3)) for k in range(n)], dtype, 2.0, 0.5)
            check(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), expected, f"scaled {dtype}")
            y = x.copy()
            assert hvd.allreduce_(y, op=hvd.Sum) is y
            check(y, reference(hvd.Sum, [data(k, dtype, (5, 3)) for k in range(n)], dtype), f"in-place {dtype}")
    # the default op is Average, as in Horovod; average=True/False is the deprecated spelling
    x = data(r, "float32", (4,))
    mean = reference(hvd.Average, [data(k, "float32", (4,)) for k in range(n)], "float32")
    check(hvd.allreduce(x), mean, "default op")
    check(hvd.allreduce(x, average=False), reference(hvd.Sum, [data(k, "float32", (4,)) for k in range(n)], "float32"), "average=False")
    # non-contiguous input
    m = data(r, "float64", (6, 4))
    check(hvd.allreduce(m[:, ::2], op=hvd.Sum), reference(hvd.Sum, [data(k, "float64", (6, 4))[:, ::2] for k in range(n)], "float64"), "strided")
    hvd.shutdown()
    return count


def allgather_worker() -> bool:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for dtype in ALL_DTYPES:
        for trailing in [(), (3,), (2, 2)]:
            rows = lambda k: (k * 2 + 1) % 4  # noqa: E731 - rank 0 may send 1 row, others 3, 1, 3, ... some 0
            mine = data(r, dtype, (rows(r), *trailing))
            out = hvd.allgather(mine)
            expected = np.concatenate([data(k, dtype, (rows(k), *trailing)) for k in range(n)])
            check(out, expected, f"allgather {dtype} {trailing}")
        check(hvd.allgather(data(r, dtype, ())), np.stack([data(k, dtype, ()) for k in range(n)]), f"allgather 0-d {dtype}")
        empty = hvd.allgather(np.zeros((0, 2), DTYPES[dtype]))
        assert empty.shape == (0, 2), empty.shape
    big = data(r, "float32", (50_001 + r,))
    check(hvd.allgather(big), np.concatenate([data(k, "float32", (50_001 + k,)) for k in range(n)]), "allgather big")
    hvd.shutdown()
    return True


def broadcast_worker() -> bool:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        for dtype in ALL_DTYPES:
            for shape in SHAPES:
                x = data(r, dtype, shape, salt=root)
                expected = data(root, dtype, shape, salt=root)
                check(hvd.broadcast(x, root_rank=root), expected, f"broadcast {dtype} {shape} root={root}")
                y = x.copy()
                hvd.broadcast_(y, root)
                check(y, expected, f"broadcast_ {dtype} {shape} root={root}")
                if r != root:
                    check(x, data(r, dtype, shape, salt=root), "broadcast must not modify its input")
    hvd.shutdown()
    return True


def alltoall_worker() -> bool:
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    def splits_of(k: int) -> list[int]:
        return [(k + j) % 3 for j in range(n)]

    for dtype in ALL_DTYPES:
        for trailing in [(), (2, 3)]:
            def rows_of(k: int, dtype: str = dtype, trailing: tuple[int, ...] = trailing) -> np.ndarray:
                return data(k, dtype, (sum(splits_of(k)), *trailing))

            out, received = hvd.alltoall(rows_of(r), splits=splits_of(r))
            parts = []
            for k in range(n):
                start = sum(splits_of(k)[:r])
                parts.append(rows_of(k)[start : start + splits_of(k)[r]])
            check(out, np.concatenate(parts), f"alltoall {dtype} {trailing}")
            np.testing.assert_array_equal(received, [splits_of(k)[r] for k in range(n)])
        equal = data(r, dtype, (2 * n, 3))
        out = hvd.alltoall(equal)  # no splits: equal slices, and only the output comes back
        check(out, np.concatenate([data(k, dtype, (2 * n, 3))[2 * r : 2 * r + 2] for k in range(n)]), f"alltoall equal {dtype}")
    # splits that sum to fewer rows than the tensor has: the rows past their sum are not sent (Horovod's behaviour)
    longer = data(r, "float32", (sum(splits_of(r)) + 2, 3))
    out, received = hvd.alltoall(longer, splits=splits_of(r))
    parts = [data(k, "float32", (sum(splits_of(k)) + 2, 3))[sum(splits_of(k)[:r]) :][: splits_of(k)[r]] for k in range(n)]
    check(out, np.concatenate(parts), "alltoall of the first rows")
    try:
        hvd.alltoall(longer, splits=[s + 3 for s in splits_of(r)])
    except ValueError as e:
        assert "more than the first dimension" in str(e), e
    else:
        raise AssertionError("alltoall splits summing past the first dimension did not raise")
    big = data(r, "float64", (40_000 * n,))
    check(hvd.alltoall(big), np.concatenate([data(k, "float64", (40_000 * n,))[40_000 * r : 40_000 * (r + 1)] for k in range(n)]), "alltoall big")
    hvd.shutdown()
    return True


def reducescatter_worker() -> bool:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for dtype in ALL_DTYPES:
        ops = [hvd.Sum, hvd.Min, hvd.Max] if dtype == "bool" else [hvd.Sum, hvd.Min, hvd.Max, hvd.Average]
        for op in ops:
            for shape in [(2 * n + 1, 3), (1,), (n,), (30_001,)]:
                full = reference(op, [data(k, dtype, shape) for k in range(n)], dtype)
                rows = even_counts(shape[0], n)
                start = sum(rows[:r])
                out = hvd.reducescatter(data(r, dtype, shape), op=op)
                check(out, full[start : start + rows[r]], f"reducescatter {dtype} op={op} {shape}")
    # Horovod's default op for reducescatter is Average
    x = data(r, "float32", (n * 2,))
    full = reference(hvd.Average, [data(k, "float32", (n * 2,)) for k in range(n)], "float32")
    check(hvd.reducescatter(x), full[2 * r : 2 * r + 2], "reducescatter default op")
    hvd.shutdown()
    return True


def async_order_worker() -> bool:
    """Ranks submit in different orders; grouped and in-place variants; poll."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    names = [f"t{i}" for i in range(12)]
    order = list(np.random.default_rng(r + 100).permutation(len(names)))
    handles = {}
    for i in order:
        name = names[i]
        x = data(r, "float32", (i + 1, 3), salt=i)
        if i % 3 == 0:
            handles[name] = hvd.allreduce_async(x, op=hvd.Sum, name=name)
        elif i % 3 == 1:
            handles[name] = hvd.allgather_async(x, name=name)
        else:
            handles[name] = hvd.broadcast_async(x, root_rank=i % n, name=name)
    for i, name in enumerate(names):
        out = hvd.synchronize(handles[name])
        assert hvd.poll(handles[name])
        parts = [data(k, "float32", (i + 1, 3), salt=i) for k in range(n)]
        if i % 3 == 0:
            check(out, reference(hvd.Sum, parts, "float32"), name)
        elif i % 3 == 1:
            check(out, np.concatenate(parts), name)
        else:
            check(out, parts[i % n], name)
    tensors = [data(r, "float64", (k + 2,), salt=k) for k in range(5)]
    expected = [reference(hvd.Average, [data(q, "float64", (k + 2,), salt=k) for q in range(n)], "float64") for k in range(5)]
    for got, exp in zip(hvd.grouped_allreduce(tensors), expected):
        check(got, exp, "grouped_allreduce")
    copies = [t.copy() for t in tensors]
    handle = hvd.grouped_allreduce_async_(copies)
    hvd.synchronize(handle)
    for got, exp in zip(copies, expected):
        check(got, exp, "grouped_allreduce_async_")
    h = hvd.allreduce_async_(copies[0], op=hvd.Sum, name="inplace-async")
    assert hvd.synchronize(h) is copies[0]
    hvd.barrier()
    hvd.shutdown()
    return True


def join_worker(op: int) -> int:
    """Rank r has r+1 batches; ranks out of data contribute zeros until every rank joined."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for step in range(r + 1):
        out = hvd.allreduce(np.ones(4, np.float32), op=op, name=f"step{step}")
        active = n - step  # ranks step..n-1 still have data
        expected = active / n if op == hvd.Average else active
        np.testing.assert_allclose(out, np.full(4, expected, np.float32), err_msg=f"step {step}")
    last = hvd.join()
    hvd.shutdown()
    return last


def object_worker() -> bool:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        obj = {"root": root, "payload": list(range(root * 1000)), "text": "é" * root} if r == root else None
        got = hvd.broadcast_object(obj, root_rank=root)
        assert got == {"root": root, "payload": list(range(root * 1000)), "text": "é" * root}, got
    gathered = hvd.allgather_object({"rank": r, "blob": b"x" * (r * 5000)})
    assert gathered == [{"rank": k, "blob": b"x" * (k * 5000)} for k in range(n)]
    hvd.shutdown()
    return True


def topology_worker() -> dict:
    import os

    hvd.init()
    info = {
        "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "homogeneous": hvd.is_homogeneous(),
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                               "MASTER_PORT", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                                               "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
                                               "HOROVOD_HOSTNAME")},
    }
    hvd.shutdown()
    hvd.init()  # init after shutdown starts a fresh group
    assert hvd.allreduce(np.array([1.0]), op=hvd.Sum)[0] == hvd.size()
    hvd.shutdown()
    return info


def process_set_worker() -> bool:
    """hora.numpy's process_set= on 4 ranks: each set's results involve its members only, root_rank is global,
    async handles complete on their set, and a non-member gets a clear error."""
    hvd.init()
    me = hvd.rank()
    evens, odds = hvd.add_process_set([0, 2]), hvd.add_process_set([1, 3])
    mine, other = (evens, odds) if me % 2 == 0 else (odds, evens)
    members = mine.ranks
    check(hvd.allreduce(np.array([float(me)]), op=hvd.Sum, process_set=mine), np.array([float(sum(members))]), "sum")
    check(hvd.allreduce(np.array([1.0]), op=hvd.Sum), np.array([4.0]), "global sum between set ops")
    check(hvd.broadcast(np.array([me]), members[1], process_set=mine), np.array([members[1]]), "broadcast")
    check(hvd.broadcast(np.array([me]), root_rank=members[0], process_set=mine), np.array([members[0]]), "root kw")
    check(hvd.allgather(np.array([me]), process_set=mine), np.array(members), "allgather")
    h = hvd.allreduce_async(np.ones(3), op=hvd.Sum, name="async.on.set", process_set=mine)
    check(hvd.synchronize(h), np.full(3, 2.0), "async")
    assert hvd.allgather_object(me, process_set=mine) == members
    hvd.barrier(process_set=mine)
    try:
        hvd.allreduce(np.ones(1), process_set=other)
    except ConfigError as e:
        assert "is not a member of process set" in str(e), e
    else:
        raise AssertionError("a non-member ran a collective on a process set")
    assert hvd.remove_process_set(evens) and hvd.remove_process_set(odds)
    static_process_sets(me)
    hvd.shutdown()
    return True


def static_process_sets(me: int) -> None:
    """init(process_sets=...) on 4 ranks (hora is running, so init only registers): any iterable of ranks, sorted;
    all sets or none, whether an entry is invalid (a duplicate) or a registration fails (ranks that disagree); a
    repeated init binds a set to the one registered with its ranks."""
    first, dup = hvd.ProcessSet([0, 1]), hvd.ProcessSet(iter([1, 0]))
    try:
        hvd.init(process_sets=[first, dup])
    except ValueError as e:
        assert "entry number 1 is a duplicate" in str(e), e
    else:
        raise AssertionError("init registered a duplicate process set")
    assert first.process_set_id is None and dup.process_set_id is None
    try:  # every rank checks the list alone; the ranks find out that they disagree while registering the second set
        hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3] if me < 2 else [1, 2])])
    except ValueError as e:
        assert "same ranks" in str(e), e
    else:
        raise AssertionError("process sets that differ across ranks were registered")
    low = hvd.ProcessSet(reversed(range(2)))
    assert low.ranks == [0, 1] and low.included() == (me < 2)
    hvd.init(process_sets=[low])  # nothing was left behind by the failed calls
    if me < 2:
        check(hvd.allreduce(np.array([1.0]), op=hvd.Sum, process_set=low), np.array([2.0]), "static set")
    again = hvd.ProcessSet(range(2))
    hvd.init(process_sets=[again])  # Horovod's repeated init: the same ranks name the same set
    assert again.process_set_id == low.process_set_id and again.size() == 2
    assert hvd.remove_process_set(low)


def grouped_worker() -> bool:
    """A grouped allreduce of same-dtype tensors travels as one request: results per tensor (cached rounds too),
    never aliasing the inputs or each other; mixed dtypes still work; tensors whose sizes differ across ranks raise
    a mismatch on every rank naming the sizes, and the engine goes on; a joined rank contributes zeros."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    shapes = [(3, 4), (1,), (70_001,), (2, 2, 2), (5,)] * 6
    for op in (hvd.Sum, hvd.Average):
        for round_ in range(3):  # the second and third rounds are answered by the response cache
            tensors = [data(r, "float32", s, salt=k) for k, s in enumerate(shapes)]
            copies = [t.copy() for t in tensors]
            expected = [
                reference(op, [data(q, "float32", s, salt=k) for q in range(n)], "float32", prescale=2.0)
                for k, s in enumerate(shapes)
            ]
            outs = hvd.grouped_allreduce(tensors, op=op, prescale_factor=2.0, name=f"g{int(op)}")
            for k, (got, exp) in enumerate(zip(outs, expected)):
                check(got, exp, f"grouped_allreduce op={op} round {round_} tensor {k}")
                assert got.shape == shapes[k]
                assert not np.shares_memory(got, tensors[k]), "a result aliases its input"
                np.testing.assert_array_equal(tensors[k], copies[k], err_msg="the input changed")
            assert all(not np.shares_memory(a, b) for a, b in itertools.pairwise(outs)), "results share memory"
            inplace = [t.copy() for t in tensors]
            back = hvd.grouped_allreduce_(inplace, op=op, prescale_factor=2.0, name=f"gi{int(op)}")
            assert all(b is t for b, t in zip(back, inplace)), "in-place results are not the tensors themselves"
            for got, exp in zip(inplace, expected):
                check(got, exp, "grouped_allreduce_")
    mixed = [data(r, "float32", (4,)), data(r, "int32", (3,)), data(r, "float64", (2, 2))]
    for k, got in enumerate(hvd.grouped_allreduce(mixed, op=hvd.Sum, name="mixed")):
        dt = str(mixed[k].dtype)
        check(got, reference(hvd.Sum, [data(q, dt, mixed[k].shape) for q in range(n)], dt), f"mixed dtypes {k}")
    if n > 1:
        sizes = [2, 3] if r == 0 else [3, 2]
        try:
            hvd.grouped_allreduce([np.ones(s, np.float32) for s in sizes], name="bad")
        except MismatchError as exc:
            assert "grouped tensor sizes" in str(exc) and "[2, 3] on rank 0" in str(exc), str(exc)
        else:
            raise AssertionError("tensors of other sizes on other ranks did not raise")
    after = hvd.allreduce(np.full(3, r + 1.0), op=hvd.Sum, name="after")
    np.testing.assert_array_equal(after, np.full(3, n * (n + 1) / 2))
    for step in range(r + 1):  # rank r has r + 1 steps; joined ranks contribute zeros
        outs = hvd.grouped_allreduce([np.ones(4, np.float32), np.ones((2, 3), np.float32)], op=hvd.Sum, name="j")
        active = n - step
        np.testing.assert_array_equal(outs[0], np.full(4, active, np.float32))
        np.testing.assert_array_equal(outs[1], np.full((2, 3), active, np.float32))
    hvd.join()
    hvd.shutdown()
    return True


def adasum_reference(vectors: list[np.ndarray]) -> np.ndarray:
    """Horovod's Adasum of every rank's vector in float64: pairs (0,1), (2,3)... combined, then pairs of those."""
    tiny = np.sqrt(np.finfo(np.float64).tiny)
    level = [v.astype(np.float64).reshape(-1) for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            dot, an, bn = a @ b, a @ a, b @ b
            nxt.append((1 - dot / an / 2 if an >= tiny else 1.0) * a + (1 - dot / bn / 2 if bn >= tiny else 1.0) * b)
        level = nxt
    return level[0].reshape(vectors[0].shape)


def adasum_worker() -> bool:
    """op=Adasum against the numpy reference of Horovod's formula: orthogonal vectors add, parallel ones average,
    general ones in between; a grouped request and a fused one give each tensor its own coefficients; sizes that
    halve unevenly; float16/32/64; the scale factors; ranks not a power of two, integer tensors, process sets and
    reducescatter are refused with Horovod's messages."""
    from hora.errors import UnsupportedError

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if n & (n - 1):
        try:
            hvd.allreduce(np.ones(3, np.float32), op=hvd.Adasum)
        except UnsupportedError as exc:
            return str(exc) == "Running Adasum with non-power of 2 ranks is not supported yet."
        return False
    for bad, kw in ((np.ones(4, np.int32), {}), (np.ones((4, 2), np.float32), {"reducescatter": True})):
        try:
            if kw:
                hvd.reducescatter(bad, op=hvd.Adasum)
            else:
                hvd.allreduce(bad, op=hvd.Adasum)
            return False
        except UnsupportedError:
            pass
    sizes = [n * 20 - 17, n * 2 + 1, n + 2, 1, 4099]
    rng = np.random.default_rng(2)
    for dtype in (np.float64, np.float32, np.float16):
        eps = np.finfo(dtype).eps
        cases = []
        for k, m in enumerate(sizes):
            if k % 3 == 0 and m >= n:  # orthogonal columns: Adasum is the sum
                q = np.linalg.qr(rng.normal(0, 1, (m, n)))[0]
            elif k % 3 == 1:  # parallel columns: Adasum is the mean
                q = rng.normal(0, 1, (m, 1)) @ rng.normal(0, 1, (1, n))
            else:
                q = rng.normal(0, 1, (m, n))
            cases.append(q.astype(dtype))
        expected = [adasum_reference([q[:, i].astype(np.float64) for i in range(n)]) for q in cases]
        mine = [np.ascontiguousarray(q[:, r]) for q in cases]
        outs = {
            "allreduce": [hvd.allreduce(t, op=hvd.Adasum, name=f"ada.{dtype.__name__}.{k}") for k, t in enumerate(mine)],
            "grouped": hvd.grouped_allreduce(mine, op=hvd.Adasum, name=f"adag.{dtype.__name__}"),
        }
        handles = [hvd.allreduce_async(t, op=hvd.Adasum, name=f"adaf.{dtype.__name__}.{k}") for k, t in enumerate(mine)]
        outs["fused"] = [hvd.synchronize(h) for h in handles]  # submitted together: one fused response
        for how, got in outs.items():
            for k, (g, e) in enumerate(zip(got, expected)):
                assert g.dtype == dtype, (how, k, g.dtype)
                ratio = np.linalg.norm(g.astype(np.float64) - e) / max(np.linalg.norm(e), 1e-300) / 100
                assert ratio < eps, (how, dtype, k, sizes[k], ratio)  # Horovod's are_close
    # prescale and postscale apply around the combination, as for the other ops
    t = np.array([1.0, 2.0, 3.0]) * (r + 1)
    got = hvd.allreduce(t, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5, name="ada.scaled")
    np.testing.assert_allclose(got, adasum_reference([np.array([1.0, 2.0, 3.0]) * (q + 1) * 2 for q in range(n)]) * 0.5)
    return True


def express_worker() -> tuple[int, int]:
    """Blocking named allreduces the response cache knows run in the caller's thread (hora._engine.express) where
    the data plane is shared memory: every op and dtype (bfloat16 through numpy), in place and not, with scale
    factors, results never aliasing hora's rows; barriers; a peer that needs a full round meanwhile, and a peer whose shape
    changed (a mismatch on every rank, then the lane goes on). Returns how many calls the lane completed and how many
    it handed over to a full cycle ((-1, -1) without a lane)."""
    from hora._frontend.process_set import group_of

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for dtype in ("float32", "float64", "float16", "bfloat16", "int32"):
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            kind = "product" if op == hvd.Product else "sum"
            for k in range(3):  # the first call negotiates; the next ones may take the lane
                t = data(r, dtype, (33,), kind, salt=k)
                exp = reference(op, [data(q, dtype, (33,), kind, salt=k) for q in range(n)], dtype)
                got = hvd.allreduce(t, op=op, name=f"x.{dtype}.{int(op)}")
                check(got, exp, f"express {dtype} op={op} call {k}")
                assert not np.shares_memory(got, t)
                inplace = t.copy()
                assert hvd.allreduce_(inplace, op=op, name=f"xi.{dtype}.{int(op)}") is inplace
                check(inplace, exp, f"express in place {dtype} op={op} call {k}")
    for _ in range(3):
        t = np.full(5, r + 1.0, np.float32)
        got = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name="scaled")
        np.testing.assert_allclose(got, np.full(5, 0.5 * n * (n + 1) / 2), err_msg="scale factors")
    first = hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="steady")
    first[:] = -1  # a result is the caller's: the next call must not see this
    for k in range(5):  # odd ranks need a full round (a new name) while the even ones take the lane
        handle = hvd.allreduce_async(np.full(3, r, np.float32), op=hvd.Sum, name=f"new.{k}") if r % 2 else None
        np.testing.assert_array_equal(hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="steady"), np.full(4, n))
        new = hvd.synchronize(handle) if handle is not None else hvd.allreduce(
            np.full(3, r, np.float32), op=hvd.Sum, name=f"new.{k}")
        np.testing.assert_array_equal(new, np.full(3, n * (n - 1) / 2))
    for k in range(4):  # barriers take the lane too; odd ranks bring a new collective (a full round) to some
        handle = hvd.allreduce_async(np.full(2, r, np.float32), op=hvd.Sum, name=f"b.{k}") if r % 2 and k % 2 else None
        hvd.barrier()
        if k % 2:
            got = hvd.synchronize(handle) if handle is not None else hvd.allreduce(
                np.full(2, r, np.float32), op=hvd.Sum, name=f"b.{k}")
            np.testing.assert_array_equal(got, np.full(2, n * (n - 1) / 2))
    if n > 1:
        try:  # rank 0 keeps the cached shape, the others change it
            hvd.allreduce(np.ones(4 if r == 0 else 5, np.float32), op=hvd.Sum, name="steady")
            raise AssertionError("a shape that differs across ranks must fail")
        except MismatchError:
            pass
    for _ in range(3):
        np.testing.assert_array_equal(hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="steady"), np.full(4, n))
    lane = group_of(None).engine._express
    counts = (lane.calls, lane.handed_over) if lane is not None else (-1, -1)
    hvd.shutdown()
    return counts
