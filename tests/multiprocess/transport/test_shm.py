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

from hora._dtypes import DTYPES, ReduceOp
from hora._proc import process_start_time
from hora._transport.base import SelfTransport, Transport
from hora._transport.shm import ShmTransport, _parts, segment_path
from hora._transport.tcp import TcpTransport
from support import paths
from workers.transports import run_cases


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
                code = f"from workers.transports import shm_rank; shm_rank({theirs.fileno()}, {r}, {size}, {name!r}, {chunk})"
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code],
                        pass_fds=[theirs.fileno()],
                        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(paths.TESTS), *sys.path])},
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
            results[r] = ("ok", run_cases(planes[r], *args))
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
