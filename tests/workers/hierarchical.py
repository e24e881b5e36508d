"""Worker functions for the hierarchical (multi-host) tests, run on ranks of fake hosts (see fakehosts.py)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np

import hora.numpy as hvd
from hora._runtime.context import current
from hora.errors import HoraError
from workers.collectives import ALL_DTYPES, SHAPES, _ops, check, data, reference


def _plane_info() -> dict:
    ctx = current()
    plane = ctx.engine._transport
    return {
        "transport": ctx.transport,
        "plane": type(plane).__name__,
        "hierarchical_allreduce": getattr(plane, "hierarchical_allreduce", None),
        "hierarchical_allgather": getattr(plane, "hierarchical_allgather", None),
    }


def topology_worker() -> dict:
    hvd.init()
    info = {
        "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "homogeneous": hvd.is_homogeneous(),
        **_plane_info(),
    }
    hvd.shutdown()
    return info


def compare_worker() -> dict:
    """Every result of a battery of allreduces, allgathers and broadcasts, each checked against numpy here; the
    test compares the results of a hierarchical and a flat run of the same battery."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out: dict = {"info": _plane_info()}
    # allreduce: every dtype, op and shape, one at a time (unfused)
    for dtype in ALL_DTYPES:
        for op in _ops(dtype):
            kind = "product" if op == hvd.Product else "sum"
            for shape in SHAPES:
                got = hvd.allreduce(data(r, dtype, shape, kind), op=op)
                check(got, reference(op, [data(k, dtype, shape, kind) for k in range(n)], dtype), f"{dtype} {op} {shape}")
                out[f"allreduce {dtype} {op} {shape}"] = got
        if dtype != "bool":  # prescale / postscale
            got = hvd.allreduce(data(r, dtype, (5, 3)), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
            check(got, reference(hvd.Sum, [data(k, dtype, (5, 3)) for k in range(n)], dtype, 2.0, 0.5), f"scaled {dtype}")
            out[f"scaled {dtype}"] = got
    # fused: many asynchronous allreduces in one cycle, of several dtypes and ops
    handles = {}
    for i in range(24):
        dtype = ["float32", "int32", "float64", "float16"][i % 4]
        op = [hvd.Sum, hvd.Max, hvd.Average][i % 3]
        shape = (i * 37 % 101 + 1, 3)
        handles[(i, dtype, op, shape)] = hvd.allreduce_async(data(r, dtype, shape, salt=i), op=op, name=f"fused.{i}")
    for (i, dtype, op, shape), h in handles.items():
        got = hvd.synchronize(h)
        check(got, reference(op, [data(k, dtype, shape, salt=i) for k in range(n)], dtype), f"fused {i}")
        out[f"fused {i}"] = got
    # the same names step after step, as in training: after the first step they come from the response cache
    for step in range(4):
        hs = [hvd.allreduce_async(data(r, "float32", (50 + i,), salt=step), op=hvd.Sum, name=f"cached.{i}")
              for i in range(6)]
        for i, h in enumerate(hs):
            got = hvd.synchronize(h)
            check(got, reference(hvd.Sum, [data(k, "float32", (50 + i,), salt=step) for k in range(n)], "float32"),
                  f"cached {i} step {step}")
            out[f"cached {i} {step}"] = got
    cache = current().engine._cache
    assert cache is not None and len(cache) >= 6, "the repeated allreduces should sit in the response cache"
    # fused with scale factors, and grouped
    scaled = [hvd.allreduce_async(data(r, "float32", (7 + i,), salt=i), op=hvd.Sum, prescale_factor=0.5,
                                  postscale_factor=4.0, name=f"fscaled.{i}") for i in range(6)]
    for i, h in enumerate(scaled):
        got = hvd.synchronize(h)
        check(got, reference(hvd.Sum, [data(k, "float32", (7 + i,), salt=i) for k in range(n)], "float32", 0.5, 4.0),
              f"fused scaled {i}")
        out[f"fused scaled {i}"] = got
    group = hvd.grouped_allreduce([data(r, "int64", (k + 2, 2), salt=k) for k in range(5)], op=hvd.Sum)
    for k, got in enumerate(group):
        check(got, reference(hvd.Sum, [data(q, "int64", (k + 2, 2), salt=k) for q in range(n)], "int64"), f"grouped {k}")
        out[f"grouped {k}"] = got
    # large enough for many chunks in both transports
    big = data(r, "float32", (300_001,), salt=7)
    out["big"] = got = hvd.allreduce(big, op=hvd.Sum)
    check(got, reference(hvd.Sum, [data(k, "float32", (300_001,), salt=7) for k in range(n)], "float32"), "big")
    # random floats: sums are rounded, so only the same reduction order gives the same bits
    noise = np.random.default_rng(r).standard_normal(10_007).astype(np.float32)
    out["noise"] = got = hvd.allreduce(noise, op=hvd.Sum)
    expected = np.sum([np.random.default_rng(k).standard_normal(10_007).astype(np.float32) for k in range(n)], axis=0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # allgather: varying first dimensions (some ranks send nothing), every dtype
    for dtype in ALL_DTYPES:
        for trailing in [(), (3,), (2, 2)]:
            def rows(k: int) -> int:
                return (k * 2 + 1) % 4
            got = hvd.allgather(data(r, dtype, (rows(r), *trailing)))
            check(got, np.concatenate([data(k, dtype, (rows(k), *trailing)) for k in range(n)]), f"ag {dtype} {trailing}")
            out[f"allgather {dtype} {trailing}"] = got
    zero_here = hvd.allgather(np.full((0 if r == 0 else r + 1000, 2), r, np.int16))
    check(zero_here, np.concatenate([np.full((0 if k == 0 else k + 1000, 2), k, np.int16) for k in range(n)]), "ag 0")
    out["allgather big"] = got = hvd.allgather(data(r, "float64", (40_001 + r * 3,)))
    check(got, np.concatenate([data(k, "float64", (40_001 + k * 3,)) for k in range(n)]), "allgather big")
    # broadcast from every root
    for root in range(n):
        for dtype in ["float32", "int8", "bool", "bfloat16"]:
            for shape in [(), (0,), (5, 3), (70_001,)]:
                x = data(r, dtype, shape, salt=root)
                got = hvd.broadcast(x, root_rank=root)
                check(got, data(root, dtype, shape, salt=root), f"broadcast {dtype} {shape} root={root}")
                if r != root:
                    check(x, data(r, dtype, shape, salt=root), "broadcast must not modify its input")
                out[f"broadcast {dtype} {shape} {root}"] = got
    hvd.shutdown()
    return out


def killed_peer_worker(tmpdir: str, victim: int) -> None:
    """The victim SIGKILLs itself during a stream of large allreduces; every survivor must raise a HoraError."""
    hvd.init()
    r = hvd.rank()
    x = np.ones(4_000_000, np.float32)  # 16 MB: many chunks, so the kill lands inside a collective
    hvd.allreduce(x, name="warmup")
    if r == victim:
        def die() -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(0.3, die).start()
    try:
        for i in range(100_000):
            hvd.allreduce(x, name=f"big{i}")
            hvd.allgather(x[: 1000 + r], name=f"ag{i}")
    except HoraError as exc:
        with open(os.path.join(tmpdir, f"survivor.{r}"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        os._exit(3)
    raise AssertionError("the loop ended without losing the peer")


def stuck_worker(tmpdir: str, victim: int) -> None:
    """The victim stops (SIGSTOP) between collectives, alive but stuck; the others must fail with a clear error."""
    hvd.init()
    r = hvd.rank()
    x = np.ones(1_000_000, np.float32)
    hvd.allreduce(x, name="warmup")
    if r == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        for i in range(100_000):
            hvd.allreduce(x, name=f"big{i}")
    except HoraError as exc:
        with open(os.path.join(tmpdir, f"survivor.{r}"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        os._exit(3)
    raise AssertionError("the loop ended without an error")


def settings_worker() -> dict:
    hvd.init()
    info = _plane_info()
    hvd.shutdown()
    return info


__all__ = ["compare_worker", "killed_peer_worker", "process_set_worker", "settings_worker", "stuck_worker",
           "topology_worker"]


def process_set_worker() -> bool:
    """A process set spanning both hosts runs over TCP among its members while the global set is hierarchical."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    members = [0, n - 2, n - 1]
    pset = hvd.add_process_set(members)
    x = data(r, "int32", (1001,))
    if r in members:
        got = hvd.allreduce(x, op=hvd.Sum, name="set.sum", process_set=pset)
        check(got, reference(hvd.Sum, [data(k, "int32", (1001,)) for k in members], "int32"), "process set allreduce")
    check(hvd.allreduce(x, op=hvd.Sum, name="global.sum"),
          reference(hvd.Sum, [data(k, "int32", (1001,)) for k in range(n)], "int32"), "global allreduce")
    hvd.shutdown()
    return True
