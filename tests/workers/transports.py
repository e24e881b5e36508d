"""The transport tests' cases: every rank generates every rank's input from a shared seed and checks its own result
against a numpy reference; :func:`shm_rank` is a shared-memory rank in a process of its own."""

from __future__ import annotations

import os
import traceback
from multiprocessing.connection import Connection

import numpy as np

from hora._dtypes import DTYPES, HALF, ReduceOp
from hora._transport import shm
from hora._transport.base import Transport
from hora._transport.shm import ShmTransport

OPS = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}
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


def run_cases(plane: Transport, seed: int, ncases: int, exact_halves: bool) -> tuple[int, list[str]]:
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
def shm_rank(fd: int, rank: int, size: int, name: str, chunk: int) -> None:
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
        conn.send(("ok", run_cases(plane, *args)))
    except BaseException:
        text = traceback.format_exc()
        if plane is not None:
            plane.abort(f"rank {rank} failed")
        conn.send(("error", text))
    finally:
        if plane is not None:
            plane.close()
        conn.close()


def waits_worker(rounds: int) -> int:
    """Many collectives of mixed sizes back to back, so ranks meet at barriers early, late and asleep; every result
    is checked exactly against what each rank contributed."""
    import hora.numpy as hvd

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    checked = 0
    for i in range(rounds):
        count = (1, 1000, 300_000)[i % 3]
        x = np.arange(count, dtype=np.float64) + me * (i + 1)
        want = np.arange(count, dtype=np.float64) * n + (i + 1) * n * (n - 1) / 2
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name=f"ar{i % 3}"), want)
        gathered = hvd.allgather(np.full(count % 7 + 1, me + i, np.int32), name=f"ag{i % 3}")
        np.testing.assert_array_equal(gathered, np.repeat(np.arange(n) + i, count % 7 + 1))
        root = i % n
        np.testing.assert_array_equal(hvd.broadcast(np.full(count, me, np.int16), root, name=f"b{i % 3}"), root)
        checked += 3
    hvd.shutdown()
    return checked


def stopped_peer_worker(tmpdir: str, victim: int) -> None:
    """The victim SIGSTOPs itself during a large allreduce; the others must end with a clear error naming it once
    the operation time-out has passed (the stopped process is alive, so it is not a lost peer)."""
    import signal
    import threading

    import hora.numpy as hvd
    from hora.errors import HoraError

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # survive hora run's clean-up long enough to report
    hvd.init()
    x = np.ones(8_000_000, np.float32)
    hvd.allreduce(x, name="warmup")
    if hvd.rank() == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
    try:
        for i in range(100_000):
            hvd.allreduce(x, name=f"big{i}")
    except HoraError as exc:
        with open(os.path.join(tmpdir, f"survivor.{hvd.rank()}"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        os._exit(3)
