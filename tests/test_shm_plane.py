"""The data planes' reductions, fused and not, on real planes: ShmTransport in real processes, TcpTransport over socket pairs.

Every rank generates every rank's input from a shared seed, so each checks its own result against a numpy
reference without talking to the others. Small chunks force many steps: pieces span several steps and many tiny
pieces share one. Float inputs are mostly integer-valued, so the reference is exact for every dtype: with the
shared-memory transport's float32 accumulation of float16/bfloat16 over more than two ranks, the result is the exact
reduction rounded once, which the test checks bit for bit (a half-precision accumulation would differ).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from hora._dtypes import DTYPES, HALF, ReduceOp
from hora._proc import process_start_time
from hora._transport import shm
from hora._transport.base import SelfTransport, Transport
from hora._transport.shm import ShmTransport, _parts, segment_path
from hora._transport.tcp import TcpTransport

OPS = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}
_TESTS = os.path.dirname(os.path.abspath(__file__))
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


# -- cases: sizes and data every rank can regenerate ----------------------------------------------------------------
def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in HALF


def _piece_sizes(rng: np.random.Generator) -> list[int]:
    shape = rng.integers(6)
    if shape == 0:
        return []
    if shape == 1:
        return [0] * int(rng.integers(1, 4))
    if shape == 2:
        return [int(rng.integers(1, 5000))]
    if shape == 3:  # many tiny pieces, several within one step
        return [int(x) for x in rng.integers(0, 4, int(rng.integers(50, 400)))]
    sizes = []
    for _ in range(int(rng.integers(1, 40))):
        c = rng.random()
        sizes.append(0 if c < 0.2 else int(rng.integers(1, 8 if c < 0.6 else 300 if c < 0.9 else 3000)))
    return sizes


def _values(rng: np.random.Generator, dt: np.dtype, op: int, n: int, fractional: bool, exact_halves: bool) -> np.ndarray:
    if dt == np.bool_:
        return rng.random(n) < 0.7
    if not _is_float(dt):
        info = np.iinfo(dt)
        return rng.integers(info.min, int(info.max) + 1, n, dtype=dt)
    if fractional:
        return rng.uniform(-1, 1, n).astype(dt)
    if op == ReduceOp.PRODUCT:
        bound = 4
    elif dt in HALF:
        # Past the dtype's integer precision, so only a widened accumulation that rounds once matches exactly;
        # a plane that accumulates in half precision gets the small range, where every partial sum is exact.
        bound = (1000 if dt == DTYPES["float16"] else 300) if exact_halves else 60
    else:
        bound = 1_000_000
    return rng.integers(-bound, bound + 1, n).astype(dt)


def _reference(inputs: list[np.ndarray], op: int) -> np.ndarray:
    dt = inputs[0].dtype
    if _is_float(dt):
        acc = inputs[0].astype(np.float64)
        for x in inputs[1:]:
            _UFUNC[ReduceOp(op)](acc, x.astype(np.float64), out=acc)
        return acc.astype(dt)
    acc = inputs[0].copy()
    for x in inputs[1:]:
        _UFUNC[ReduceOp(op)](acc, x, out=acc)
    return acc


def _mismatch(got: np.ndarray, want: np.ndarray, fractional: bool, size: int) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    if _is_float(want.dtype):
        g, w = got.astype(np.float64), want.astype(np.float64)
        atol = (size * size + 1) * _EPS[want.dtype.name] if fractional else 0.0
        bad = np.flatnonzero(~np.isclose(g, w, rtol=0.0, atol=atol))
    else:
        bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        return f"{bad.size} wrong elements, first at {i}: got {got[i]!r}, want {want[i]!r}"
    return None


def _run_cases(plane: Transport, seed: int, ncases: int, exact_halves: bool) -> tuple[int, list[str]]:
    """Run the same cases as every other rank; return (cases run, failures)."""
    me, size = plane.rank, plane.size
    failures: list[str] = []
    k = 0

    def check(label: str, got: np.ndarray, want: np.ndarray, fractional: bool) -> None:
        problem = _mismatch(got, want, fractional, size)
        if problem:
            failures.append(f"rank {me} {label}: {problem}")

    cases = [(name, op, frac) for name in DTYPES for op in OPS for frac in (False, True)
             if not frac or _is_float(DTYPES[name])]
    for _rep in range(ncases):
        for name, op, fractional in cases:
            k += 1
            dt = DTYPES[name]
            shared = np.random.default_rng([seed, k])
            kind = ("fused", "fused", "allreduce", "reducescatter")[int(shared.integers(4))]
            label = f"case {k} ({kind} {name} {ReduceOp(op).name}{' fractional' if fractional else ''})"
            data = [np.random.default_rng([seed, k, r + 1]) for r in range(size)]
            if kind == "fused":
                sizes = _piece_sizes(shared)
                in_place = shared.random(len(sizes)) < 0.5
                label += f" sizes={sizes if len(sizes) < 12 else f'{len(sizes)} pieces, {sum(sizes)} elements'}"
                pieces = [[_values(g, dt, op, n, fractional, exact_halves) for n in sizes] for g in data]
                want = _reference([np.concatenate([*p, np.empty(0, dt)]) for p in pieces], op)
                srcs = pieces[me]
                before = [s.copy() for s in srcs]
                dsts = [s if ip else np.full(s.size, 7, dt) for s, ip in zip(srcs, in_place)]
                plane.allreduce_fused(srcs, dsts, op)
                check(label, np.concatenate([*dsts, np.empty(0, dt)]), want, fractional)
                for i, ip in enumerate(in_place):
                    if not ip and not np.array_equal(srcs[i].view(np.uint8), before[i].view(np.uint8)):
                        failures.append(f"rank {me} {label}: out-of-place source piece {i} was modified")
            elif kind == "allreduce":
                n = int(shared.integers(0, 6000)) if shared.random() < 0.8 else int(shared.integers(0, 5))
                in_place = bool(shared.random() < 0.5)
                label += f" n={n}{' in place' if in_place else ''}"
                inputs = [_values(g, dt, op, n, fractional, exact_halves) for g in data]
                want = _reference(inputs, op)
                src = inputs[me].copy()
                dst = src if in_place else np.full(n, 7, dt)
                plane.allreduce(src, dst, op)
                check(label, dst, want, fractional)
                if not in_place and not np.array_equal(src.view(np.uint8), inputs[me].view(np.uint8)):
                    failures.append(f"rank {me} {label}: the out-of-place source was modified")
            else:
                counts = [int(c) if shared.random() < 0.8 else 0 for c in shared.integers(0, 2500, size)]
                label += f" counts={counts}"
                inputs = [_values(g, dt, op, sum(counts), fractional, exact_halves) for g in data]
                lo = sum(counts[:me])
                want = _reference(inputs, op)[lo : lo + counts[me]]
                dst = np.full(counts[me], 7, dt)
                plane.reducescatter(inputs[me].copy(), dst, counts, op)
                check(label, dst, want, fractional)
    return k, failures


# -- ShmTransport in real processes ----------------------------------------------------------------------------------------
# Plain subprocesses talking to the test over a socket pair each (multiprocessing's start methods leave a helper
# process behind, which the hygiene fixture would rightly call a leak).
def _child(fd: int, rank: int, size: int, name: str, chunk: int) -> None:
    """A rank: receive the peers, create or attach, wait for "go", run the cases, send the result."""
    conn = Connection(fd)
    plane: ShmTransport | None = None
    try:
        peers, args, own_piece_bytes = conn.recv()
        if own_piece_bytes is not None:
            shm._OWN_PIECE_BYTES = own_piece_bytes
        plane = ShmTransport(name, rank, size, chunk, peers, 30.0, create=rank == 0)
        conn.send("ready")
        assert conn.recv() == "go"
        plane.unlink()
        conn.send(("ok", _run_cases(plane, *args)))
    except BaseException:
        text = traceback.format_exc()
        if plane is not None:
            plane.abort(f"rank {rank} failed")
        conn.send(("error", text))
    finally:
        if plane is not None:
            plane.close()
        conn.close()


def _run_shm(
    size: int, chunk: int, args: tuple, own_piece_bytes: int | None = None, timeout: float = 240.0
) -> list[Any]:
    name = f"hora-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen] = []
    conns: list[Connection] = []

    def recv(r: int) -> Any:
        if not conns[r].poll(max(0.0, deadline - time.monotonic())):
            pytest.fail(f"rank {r} did not answer within {timeout:g}s")
        try:
            return conns[r].recv()
        except EOFError:
            pytest.fail(f"rank {r} died (exit code {procs[r].wait(5)})")

    try:
        for r in range(size):
            mine, theirs = socket.socketpair()
            with theirs:
                code = f"from test_shm_plane import _child; _child({theirs.fileno()}, {r}, {size}, {name!r}, {chunk})"
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code],
                        pass_fds=[theirs.fileno()],
                        env={**os.environ, "PYTHONPATH": os.pathsep.join([_TESTS, *sys.path])},
                    )
                )
            conns.append(Connection(mine.detach()))
        peers = [(p.pid, process_start_time(p.pid)) for p in procs]
        for r in range(size):  # rank 0 creates the segment before the others attach
            conns[r].send((peers, args, own_piece_bytes))
            if r == 0 and recv(0) != "ready":
                pytest.fail("rank 0 could not create the segment")
        for r in range(1, size):
            if recv(r) != "ready":
                pytest.fail(f"rank {r} could not attach")
        for c in conns:
            c.send("go")
        results = []
        for r in range(size):
            status, value = recv(r)
            if status != "ok":
                pytest.fail(f"rank {r} failed:\n{value}")
            results.append(value)
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for c in conns:
            c.close()
        try:
            os.unlink(segment_path(name))
        except FileNotFoundError:
            pass


@pytest.mark.parametrize(
    ("size", "chunk", "ncases", "own_piece_bytes"),
    [(2, 4096, 2, None), (3, 4096, 2, None), (4, 4096, 2, None), (3, 4096, 1, 1), (3, 1 << 16, 1, None)],
    # own_piece_bytes=1: the owner combines piece by piece instead of packing its own slice (the large-piece path)
    ids=["np2-4k", "np3-4k", "np4-4k", "np3-4k-combine-per-piece", "np3-64k"],
)
def test_shm_reductions_against_numpy(size, chunk, ncases, own_piece_bytes):
    results = _run_shm(size, chunk, (1000 + size + chunk, ncases, True), own_piece_bytes)
    counts = {k for k, _ in results}
    assert len(counts) == 1 and counts.pop() > 0
    failures = [f for _, fs in results for f in fs]
    assert not failures, "\n".join(failures[:40])


# -- TcpTransport (the base class's packing default) over socket pairs, one thread per rank ------------------------------
def _run_tcp(size: int, chunk: int, args: tuple, timeout: float = 120.0) -> list[Any]:
    socks: list[dict[int, socket.socket]] = [{} for _ in range(size)]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for i in range(size):
            for j in range(i + 1, size):
                socks[i][j] = socket.create_connection(listener.getsockname())
                socks[j][i] = listener.accept()[0]
    planes = [TcpTransport(r, size, socks[r], chunk, 30.0) for r in range(size)]
    results: list[Any] = [None] * size

    def rank_main(r: int) -> None:
        try:
            results[r] = ("ok", _run_cases(planes[r], *args))
        except BaseException:
            results[r] = ("error", traceback.format_exc())
            planes[r].abort("failed")

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            for p in planes:
                p.abort("timed out")
            pytest.fail(f"the TCP ranks did not finish within {timeout:g}s")
    finally:
        for t in threads:
            t.join(10)
        for p in planes:
            p.close()
    for r, (status, value) in enumerate(results):
        if status != "ok":
            pytest.fail(f"rank {r} failed:\n{value}")
    return [value for _, value in results]


@pytest.mark.parametrize("size", [2, 3])
def test_tcp_reductions_against_numpy(size):
    results = _run_tcp(size, 4096, (2000 + size, 1, False))
    failures = [f for _, fs in results for f in fs]
    assert not failures, "\n".join(failures[:40])


# -- the base-class default and SelfTransport, in process ----------------------------------------------------------------
class _DoublingPlane(SelfTransport):
    """A stand-in for two identical ranks summing: allreduce doubles. Records what allreduce was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def allreduce(self, src: np.ndarray, dst: np.ndarray, op: int) -> None:
        self.calls.append((src, dst))
        np.add(src, src, out=dst)

    allreduce_fused = Transport.allreduce_fused


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_default_fused_packs_reduces_once_and_unpacks(dtype):
    dt = DTYPES[dtype]
    plane = _DoublingPlane()
    sizes = [3, 0, 1, 17, 0, 5]
    srcs = [np.arange(n, dtype=np.float32).astype(dt) + i for i, n in enumerate(sizes)]
    before = [s.copy() for s in srcs]
    dsts = [s if i % 2 else np.zeros(s.size, dt) for i, s in enumerate(srcs)]
    plane.allreduce_fused(srcs, dsts, ReduceOp.SUM)
    assert len(plane.calls) == 1
    packed, out = plane.calls[0]
    assert packed is out and packed.size == sum(sizes) and packed.dtype == dt
    for b, d in zip(before, dsts):
        np.testing.assert_array_equal(d.astype(np.float64), (b + b).astype(np.float64))
    for i in range(0, len(srcs), 2):  # out-of-place sources are untouched
        np.testing.assert_array_equal(srcs[i], before[i])

    one = np.ones(4, dt)
    plane.allreduce_fused([one], [one], ReduceOp.SUM)  # one piece goes straight to allreduce, no packing
    assert plane.calls[-1][0] is one and plane.calls[-1][1] is one
    plane.allreduce_fused([], [], ReduceOp.SUM)
    assert len(plane.calls) == 2


def test_self_plane_fused_copies():
    plane = SelfTransport()
    srcs = [np.arange(5, dtype=np.int32), np.zeros(0, np.int32), np.arange(3, dtype=np.int32)]
    dsts = [np.zeros(5, np.int32), srcs[1], srcs[2]]
    plane.allreduce_fused(srcs, dsts, ReduceOp.SUM)
    np.testing.assert_array_equal(dsts[0], np.arange(5))
    np.testing.assert_array_equal(dsts[2], np.arange(3))


def test_parts_maps_ranges_onto_views_of_the_pieces():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        sizes = [int(x) for x in rng.choice([0, 0, 1, 2, 3, 17, 100], int(rng.integers(1, 9)))]
        total = sum(sizes)
        if total == 0:
            continue
        whole = np.arange(total)
        arrs = np.split(whole.copy(), np.cumsum(sizes)[:-1])
        ends = np.cumsum(sizes).tolist()
        lo = int(rng.integers(total))
        m = int(rng.integers(1, total - lo + 1))
        parts = _parts(arrs, ends, lo, m)
        np.testing.assert_array_equal(np.concatenate(parts), whole[lo : lo + m])
        for part in parts:  # views into the pieces (the gather writes through them), not copies
            assert part.size == 0 or any(np.shares_memory(part, a) for a in arrs)
        assert parts[0].size and parts[-1].size


def test_only_the_shared_memory_plane_stages_pieces():
    # The engine packs into its own fusion buffer for planes that would only pack into a temporary themselves.
    assert ShmTransport.stages_pieces and not TcpTransport.stages_pieces and not SelfTransport.stages_pieces
