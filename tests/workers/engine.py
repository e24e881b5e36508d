"""Worker functions for the engine tests: fusion, the response cache, join, the stall inspector, the timeline."""

from __future__ import annotations

import logging
import random
import time

import numpy as np

import hora.numpy as hvd
from hora.errors import StallError
from workers.collectives import check, data, reference

DTYPES = ["float32", "float64", "int32", "int64", "float16", "uint8"]


def _tensor_set(step_seed: int, count: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """The same random (name, dtype, shape) list on every rank for a step; some names reappear across steps with
    another shape or dtype, which must invalidate their cache slot."""
    rng = random.Random(step_seed)
    out = []
    for i in rng.sample(range(count * 2), count):
        dtype = rng.choice(DTYPES)
        shape = tuple(rng.randint(0, 40) for _ in range(rng.randint(0, 2)))
        if rng.random() < 0.1:
            shape = (rng.randint(1000, 30_000),)  # big enough to span several fusion groups / shm steps
        out.append((f"t{i}", dtype, shape))
    return out


def random_fusion_worker(steps: int, count: int, seed: int) -> int:
    """Every step: a random set of tensors, submitted async in a rank-specific random order (with random pauses
    so they straddle cycles), then checked against the exact sum. Returns the number of tensors checked."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    order_rng = random.Random(seed * 1000 + me)
    checked = 0
    for step in range(steps):
        # half the steps reuse step 0's set (cache hits), the rest draw new sets (misses, invalidations)
        tensors = _tensor_set(seed if step % 2 == 0 else seed + step, count)
        order = list(range(len(tensors)))
        order_rng.shuffle(order)
        handles = {}
        for j in order:
            name, dtype, shape = tensors[j]
            handles[j] = hvd.allreduce_async(data(me, dtype, shape, salt=step), name=name, op=hvd.Sum)
            if order_rng.random() < 0.05:
                time.sleep(order_rng.random() * 0.01)
        for j, (_name, dtype, shape) in enumerate(tensors):
            out = hvd.synchronize(handles[j])
            expect = sum(data(r, dtype, shape, salt=step).astype(np.int64) for r in range(n))
            assert out.shape == shape and out.dtype == np.dtype(dtype), (out.shape, out.dtype, shape, dtype)
            if dtype == "uint8":
                expect = expect % 256
            if dtype == "float16":
                assert np.allclose(out.astype(np.float64), expect, atol=0.5)
            else:
                assert np.array_equal(out.astype(np.int64), expect), (step, j, dtype, shape)
            checked += 1
    hvd.shutdown()
    return checked


def scaled_fusion_worker() -> list[float]:
    """Average and scale factors inside fused groups, and groups split by op."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    handles = [
        hvd.allreduce_async(np.full(5, me + 1.0), name=f"avg{i}", op=hvd.Average) for i in range(10)
    ] + [
        hvd.allreduce_async(np.full(3, me + 1.0), name=f"pre{i}", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
        for i in range(10)
    ] + [hvd.allreduce_async(np.full(2, float(me)), name=f"max{i}", op=hvd.Max) for i in range(10)]
    outs = [hvd.synchronize(h) for h in handles]
    mean = sum(range(1, n + 1)) / n
    assert all(np.allclose(o, mean) for o in outs[:10])
    assert all(np.allclose(o, sum(range(1, n + 1))) for o in outs[10:20])
    assert all(np.array_equal(o, [n - 1.0, n - 1.0]) for o in outs[20:])
    hvd.shutdown()
    return [float(outs[0][0]), float(outs[10][0]), float(outs[20][0])]


def cached_join_worker(steps: int) -> list[float]:
    """Rank r runs ``steps - r`` steps of two named allreduces (cached after the first), then joins; the ranks
    still running get the joined ranks' zeros."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    results = []
    for step in range(steps - me):
        a = hvd.allreduce(np.full(4, 1.0), name="grad.a", op=hvd.Sum)
        b = hvd.allreduce(np.full(2, float(step)), name="grad.b", op=hvd.Sum)
        active = sum(1 for r in range(n) if step < steps - r)
        assert np.allclose(a, active), (step, a, active)
        assert np.allclose(b, step * active), (step, b)
        results.append(float(a[0]))
    last = hvd.join()
    assert last == 0  # rank 0 runs the most steps, so it joins last
    # after everyone joined, the cache still works for everyone
    again = hvd.allreduce(np.full(4, 1.0), name="grad.a", op=hvd.Sum)
    assert np.allclose(again, n)
    hvd.shutdown()
    return results


def changing_shape_worker() -> list[tuple[int, ...]]:
    """The same name with a new shape each time: every call must renegotiate, on every rank."""
    hvd.init()
    shapes = []
    for k in [3, 3, 5, 5, 1, 0, 3]:
        out = hvd.allreduce(np.ones(k), name="resized", op=hvd.Sum)
        assert np.allclose(out, hvd.size()) and out.shape == (k,)
        shapes.append(out.shape)
    g = [hvd.allgather(np.zeros((hvd.rank() + k, 2)), name="gathered") for k in (1, 1, 2)]
    assert [x.shape[0] for x in g] == [sum(r + k for r in range(hvd.size())) for k in (1, 1, 2)]
    hvd.shutdown()
    return shapes


def stall_worker(cached: bool, sleep: float) -> str:
    """Rank 1 never submits 'late.grad' until long after the others; with a shutdown time every rank must fail
    with StallError. With ``cached`` the tensor was negotiated once before, so it waits as a cache bit first."""
    hvd.init()
    if cached:
        hvd.allreduce(np.ones(3), name="late.grad")
    if hvd.rank() == 1:
        time.sleep(sleep)
    try:
        hvd.allreduce(np.ones(3), name="late.grad")
        if hvd.rank() == 1:
            hvd.allreduce(np.ones(3), name="after.sleep")
    except StallError as exc:
        return f"StallError: {exc}"
    finally:
        hvd.shutdown()
    return "completed"


def stall_warning_worker(sleep: float) -> tuple[list[float], list[str], float]:
    """Rank 1 is late by ``sleep`` seconds (more than the check time, less than the shutdown time): rank 0 logs the
    stall report, then the collective completes. Returns the result, the warnings hora logged on this rank, and the
    CPU time this process used while it waited in the collective, as a fraction of the wait."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("hora").addHandler(Collect(logging.WARNING))
    hvd.init()
    if hvd.rank() == 1:
        time.sleep(sleep)
    cpu, wall = time.process_time(), time.monotonic()
    out = hvd.allreduce(np.ones(3), name="slow.tensor", op=hvd.Sum)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    hvd.shutdown()
    return out.tolist(), records, cpu / wall


def stall_timing_worker(cached: bool, sleep: float) -> tuple[float, float | None]:
    """Rank 1 submits 'timed' ``sleep`` seconds after rank 0. Returns (when rank 0 submitted it, when rank 0
    logged the first stall warning), in time.time() seconds."""
    warned: list[float] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Stalled collectives" in record.getMessage() and not warned:
                warned.append(record.created)

    logging.getLogger("hora").addHandler(Collect(logging.WARNING))
    hvd.init()
    if cached:
        hvd.allreduce(np.ones(3), name="timed")
    hvd.barrier()
    submitted = time.time()
    if hvd.rank() == 1:
        time.sleep(sleep)
    hvd.allreduce(np.ones(3), name="timed")
    hvd.shutdown()
    return submitted, (warned[0] if warned else None)


def timeline_worker(path: str, runtime: bool) -> int:
    """A few fused and unfused collectives with a timeline on (from the environment, or started at run time)."""
    hvd.init()
    if runtime:
        hvd.start_timeline(path, mark_cycles=True)
    for step in range(3):
        # a group is enqueued at once, so it is negotiated in one cycle and fused
        hvd.grouped_allreduce([np.ones(100) for _ in range(4)], name="layer")
        hvd.broadcast(np.ones(3), root_rank=0, name="bcast")
        hvd.allgather(np.ones((hvd.rank() + 1, 2)), name=f"gather{step}")
    if runtime:
        hvd.stop_timeline()
        hvd.allreduce(np.ones(3), name="after.stop")
    rank = hvd.rank()
    hvd.shutdown()
    return rank


def repeated_small_worker(rounds: int) -> int:
    """Named small allreduces repeated round after round (after the first they are answered from the cache and,
    on shared memory, carried in the exchange itself): every op, in place and not, several dtypes. Rank r also
    submits r extra async tensors first, so the ranks' exchange rows are laid out differently."""
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    checked = 0
    cases = [
        ("sum.f32", "float32", hvd.Sum, (5,)),
        ("avg.f64", "float64", hvd.Average, (3, 2)),
        ("max.i32", "int32", hvd.Max, (7,)),
        ("min.i8", "int8", hvd.Min, ()),
        ("prod.i64", "int64", hvd.Product, (4,)),
        ("or.bool", "bool", hvd.Sum, (6,)),
        ("and.bool", "bool", hvd.Min, (6,)),
        ("sum.bf16", "bfloat16", hvd.Sum, (9,)),
        ("big.f32", "float32", hvd.Sum, (20_000,)),  # above the direct path's limit: the normal path
    ]
    for rnd in range(rounds):
        extra = [hvd.allreduce_async(np.full(3, float(k)), name=f"extra.{me}.{k}.{rnd}") for k in range(me)]
        for name, dtype, op, shape in cases:
            kind = "product" if op == hvd.Product else "sum"
            arrays = [data(r, dtype, shape, kind, salt=rnd) for r in range(n)]
            mine = arrays[me].copy()
            if rnd % 2:
                out = hvd.allreduce_(mine, name=name, op=op)
                assert out is mine
            else:
                out = hvd.allreduce(mine, name=name, op=op, postscale_factor=1.0)
            check(out, reference(op, arrays, dtype), f"{name} round {rnd}")
            checked += 1
        # the extras were named per rank: every rank must submit them all, so each submits the others' too
        others = [
            hvd.allreduce_async(np.full(3, float(k)), name=f"extra.{r}.{k}.{rnd}")
            for r in range(n)
            if r != me
            for k in range(r)
        ]
        for h in extra + others:
            hvd.synchronize(h)
    hvd.shutdown()
    return checked


def disagreeing_settings_worker(setting: str) -> str:
    """Ranks started with different fusion thresholds or cache capacities would compute different groups or
    exchange vectors of different lengths: init() must refuse on every rank."""
    import os

    from hora.errors import ConfigError

    rank = int(os.environ["HORA_RANK"])
    try:
        hvd.init(**{setting: 1024 * (1 + (rank == 1))})
    except ConfigError as exc:
        return str(exc)
    hvd.shutdown()
    return "started"


def barrier_worker(rounds: int) -> list[str]:
    """Repeated barriers (answered from the cache after the first): in round k rank k % n arrives 0.1 s late, and
    no rank may leave before it arrived. Rank 0 also calls barrier from two threads at once, which pair in turn
    with two barriers of every other rank. Returns the violations seen (none expected)."""
    import threading

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    bad = []
    for k in range(rounds):
        late = k % n
        arrived = 0.0
        if me == late:
            time.sleep(0.1)
            arrived = time.time()
        hvd.barrier()
        left = time.time()
        stamps = hvd.allgather(np.array([arrived, left]), name=f"stamps.{k}").reshape(n, 2)
        if left < stamps[late, 0]:
            bad.append(f"round {k}: rank {me} left the barrier at {left} before rank {late} reached it")
    if me == 0:
        threads = [threading.Thread(target=hvd.barrier) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if any(t.is_alive() for t in threads):
            bad.append("two concurrent barriers on rank 0 did not both finish")
    else:
        hvd.barrier()
        hvd.barrier()
    hvd.shutdown()
    return bad
