"""Shared-memory transport for ranks on one host.

One segment per job and host. Each rank owns a slot of two buffers (double buffering) of ``chunk`` bytes; a
collective runs in steps, and in each step every rank writes into its own buffer, waits at a barrier, then reads
(and, for reductions, reduces) from the others' buffers. The two buffers alternate by step, so a rank can write
step k+1 while slower peers still read step k, and one barrier per phase is enough.

Reductions are reduce-scatter + allgather: in a step every rank stages its input for *all* owners, then owner r
reduces slice r across the slots in place (``np.add(..., out=)``, which releases the GIL), then everyone copies
every owner's reduced slice out. float16/bfloat16 sums over more than two ranks accumulate in float32 and round
once.

A fused allreduce (many tensors of one dtype and op) runs the same steps over the virtual concatenation of its
pieces: staging copies from the pieces straight into the rank's slot (one ``np.concatenate(..., out=)`` per owner),
the owner reduces its own slice reading the pieces where they are (or, where they average under 64 KiB, packs them
into its slot first: a ufunc call per tiny piece costs more than the copy), and the gather copies every reduced
slice straight back out into the pieces. The slot is the fusion buffer; there is no full-size temporary.

Synchronisation is one counter per rank (own cache line), written after the rank's data: a waiter spins on a late
peer's counter for about as long as recent waits needed (adaptive, and hardly at all with more ranks than cores),
yields a few times, then sleeps in the kernel on that counter (futex) after raising a flag beside it; the peer, once
it has written its counter, wakes it when the flag is up (no syscall otherwise). So a busy machine gives the late
peer the core at once, and nobody sleep-polls. While waiting, a rank checks an
abort word that a failing peer sets, and whether the laggard processes are still alive (pid + start time), so a
peer killed mid-collective becomes a :class:`PeerLostError` within a fraction of a second instead of a hang.

The creator unlinks the segment's name as soon as every rank has attached (see ``unlink``): from then on the
memory lives exactly as long as the processes mapping it, so even SIGKILL leaves nothing in /dev/shm.

Memory ordering: written for x86-64 (TSO), where a store to the counter after the data copy is seen after it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from bisect import bisect_left, bisect_right
from itertools import accumulate

import numpy as np

from hora._dtypes import HALF, combine, even_counts, offsets, reduce_into, scale_into
from hora._proc import process_alive
from hora._transport import futex
from hora._transport.base import Transport
from hora.errors import CollectiveTimeoutError, PeerLostError, ProtocolError

__all__ = ["ShmTransport", "job_prefix", "segment_path", "sweep"]

_MAGIC = 0x484F52415348_4D31  # "HORASHM1"
_ABORT_OFF = 64
_REASON_OFF = 512
_REASON_LEN = 512
_CTR_OFF = 1024
_LINE = 64
#: A fused reduction whose own slice averages fewer bytes per piece packs it into the slot and reduces in place
#: (one copy, two calls) instead of one ufunc call per piece (whose fixed cost exceeds copying this many bytes).
_OWN_PIECE_BYTES = 64 << 10
SHM_DIR = "/dev/shm"


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def job_prefix(job_id: str) -> str:
    """Every segment of a job starts with this, so its launcher can sweep what a crash left behind."""
    return "hora-" + hashlib.sha256(job_id.encode()).hexdigest()[:16] + "-"


def sweep(job_id: str) -> list[str]:
    """Remove the job's segments that are still named (a rank died between creating and sharing one)."""
    removed: list[str] = []
    prefix = job_prefix(job_id)
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except FileNotFoundError:
        return removed
    for n in names:
        try:
            os.unlink(os.path.join(SHM_DIR, n))
            removed.append(n)
        except FileNotFoundError:
            pass
    return removed


def _parts(arrs: list[np.ndarray], ends: list[int], lo: int, m: int) -> list[np.ndarray]:
    """Views of ``arrs`` covering elements [lo, lo + m) of their virtual concatenation (piece i ends at element
    ``ends[i]``), in order; ``m`` > 0. Only the first and last are sliced, the pieces between are whole (some may be
    empty), so a step costs two bisections however many pieces it spans."""
    hi = lo + m
    i = bisect_right(ends, lo)  # the first piece ending after lo: it holds element lo
    j = bisect_left(ends, hi, i)  # the first piece ending at or after hi: it holds element hi - 1
    first = ends[i - 1] if i else 0
    if i == j:
        return [arrs[i][lo - first : hi - first]]
    return [arrs[i][lo - first :], *arrs[i + 1 : j], arrs[j][: hi - ends[j - 1]]]


def _layout(size: int, chunk: int, exchange: int) -> tuple[int, int, int, int, int]:
    """(exchange area offset, exchange row bytes, data offset, chunk, total bytes)."""
    unit = _LINE * size
    chunk = max(unit, (chunk + unit - 1) // unit * unit)
    xoff = (_CTR_OFF + _LINE * size + 4095) // 4096 * 4096
    xlen = (exchange + _LINE - 1) // _LINE * _LINE
    data = (xoff + 2 * size * xlen + 4095) // 4096 * 4096
    return xoff, xlen, data, chunk, data + 2 * size * chunk


class ShmTransport(Transport):
    """Shared-memory collectives among ``size`` ranks of one host (ranks are 0..size-1 within the group)."""

    stages_pieces = True  # allreduce_fused stages the pieces straight into the slot: packing is the only copy

    def __init__(
        self,
        name: str,
        rank: int,
        size: int,
        chunk_bytes: int,
        peers: list[tuple[int, int]],
        op_timeout: float,
        create: bool,
        exchange_bytes: int = 0,
        labels: list[str] | None = None,
        busy_processes: int = 0,
    ) -> None:
        self.rank, self.size, self.name = rank, size, name
        self._peers = peers  # (pid, start time) per rank
        # how messages name each rank (a host's transport in a multi-host job names ranks of the whole job)
        self._labels = labels or [f"rank {r}" for r in range(size)]
        self._timeout = op_timeout
        xoff, self._xlen, header, self._chunk, total = _layout(size, chunk_bytes, exchange_bytes)
        self._sub = self._chunk // size  # bytes per owner (or destination) per step, a multiple of 64
        path = segment_path(name)
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, total)
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
        else:
            fd = os.open(path, os.O_RDWR)
            if os.fstat(fd).st_size != total:
                os.close(fd)
                raise ProtocolError(
                    f"shared-memory segment {path} has the wrong size; is another job using the name?"
                )
        try:
            self._mm: mmap.mmap | None = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self._unlinked = not create
        u8 = np.frombuffer(self._mm, dtype=np.uint8)
        meta = np.ndarray((3,), np.int64, buffer=self._mm, offset=0)
        if create:
            meta[:] = (_MAGIC, size, self._chunk)
        elif tuple(meta) != (_MAGIC, size, self._chunk):
            raise ProtocolError(
                f"shared-memory segment {path} was made by an incompatible hora or another job"
            )
        self._abort = np.ndarray((1,), np.int64, buffer=self._mm, offset=_ABORT_OFF)
        self._reason = u8[_REASON_OFF : _REASON_OFF + _REASON_LEN]
        self._ctr = np.ndarray((size,), np.int64, buffer=self._mm, offset=_CTR_OFF, strides=(_LINE,))
        # Beside each counter (same cache line): set by a peer about to sleep on it, cleared by its owner on waking.
        self._sleepers = np.ndarray((size,), np.int32, buffer=self._mm, offset=_CTR_OFF + 8, strides=(_LINE,))
        self._addr = [u8.ctypes.data + _CTR_OFF + r * _LINE for r in range(size)]  # the counter's low 32 bits
        self._others = [(rank + k) % size for k in range(1, size)]
        self._bufs = [
            [u8[header + (2 * r + b) * self._chunk : header + (2 * r + b + 1) * self._chunk] for b in (0, 1)]
            for r in range(size)
        ]
        # the engine's exchange vectors: [parity][rank][xlen] int8, read by every rank after one barrier
        self._xrows = [
            np.ndarray((size, self._xlen), np.int8, buffer=self._mm, offset=xoff + p * size * self._xlen)
            for p in (0, 1)
        ]
        self._xstep = 0
        self._epoch = 0
        self._step = 0
        ncpu = os.cpu_count() or 1
        # Spinning pays only while every process that competes for this machine's cores has one: that is the
        # group's size, unless other groups run here too (``busy_processes``: fake or namespace "hosts" of a
        # multi-host job that share one kernel).
        crowded = max(size, busy_processes) > ncpu
        self._spins = 20 if crowded else 2000  # at most; about 0.25 us a check
        self._budget = self._spins
        self._lazy_spins = min(self._spins, 100)
        self._yields = 2 if crowded else 5
        self._scratch = np.empty(0, np.float32)

    # -- lifecycle --------------------------------------------------------------------------------------------
    def unlink(self) -> None:
        """Remove the segment's name (the creator calls this once every rank has attached)."""
        if not self._unlinked:
            self._unlinked = True
            try:
                os.unlink(segment_path(self.name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.unlink()
        if self._mm is None:
            return
        self._bufs = []
        self._xrows = []
        del self._abort, self._reason, self._ctr, self._sleepers
        mm, self._mm = self._mm, None
        try:
            mm.close()
        except BufferError:
            pass  # a view is still referenced somewhere; the mapping goes with it

    def abort(self, reason: str) -> None:
        if self._mm is None or self._abort[0]:
            return
        data = reason.encode()[: _REASON_LEN - 1]
        self._reason[: len(data)] = np.frombuffer(data, np.uint8)
        self._reason[len(data)] = 0
        self._abort[0] = self.rank + 1
        for address in self._addr:  # sleeping peers see the abort now, not at their next time-out
            futex.wake(address)

    # -- synchronisation ---------------------------------------------------------------------------------------
    def _next(self) -> int:
        self._step += 1
        return self._step & 1

    def exchange_begin(self) -> np.ndarray:
        """This rank's row (int8) for the next exchange, to fill in place (vector first, payload after)."""
        return self._xrows[self._xstep & 1][self.rank]

    def exchange_end(self) -> np.ndarray:
        """One barrier; then every rank's row of this exchange, shape (size, row bytes). Rows alternate by parity
        like the data buffers, so they stay valid until this rank's exchange after next: a faster rank cannot
        overwrite them before every rank has passed the next exchange's barrier."""
        rows = self._xrows[self._xstep & 1]
        self._xstep += 1
        self._barrier()
        return rows

    def exchange_next(self) -> tuple[int, np.ndarray]:
        parity = self._xstep & 1
        return parity, self._xrows[parity]

    def exchange_min(self, vec: np.ndarray) -> None:
        n = vec.size
        if n > self._xlen:
            super().exchange_min(vec)
            return
        self.exchange_begin()[:n] = vec
        np.minimum.reduce(self.exchange_end()[:, :n], axis=0, out=vec)

    def _barrier(self) -> None:
        self._epoch += 1
        v = self._epoch
        ctr, me = self._ctr, self.rank
        ctr[me] = v
        if self._sleepers[me]:  # a peer sleeps on this rank's counter: wake it (no syscall when none does)
            self._sleepers[me] = 0
            futex.wake(self._addr[me])
        for r in self._others:  # counters only grow: one pass over the peers in turn is enough
            if ctr[r] < v:
                self._wait_for(r, v)

    def _wait_for(self, r: int, v: int) -> None:
        """Wait until rank ``r`` has reached barrier ``v``: spin a little (adaptively: about as long as recent
        waits needed, holding the GIL only when the waiting thread has nothing else to let run), yield a few times,
        then sleep on ``r``'s counter until ``r`` wakes this rank (futex)."""
        ctr = self._ctr
        budget = self._budget if self.eager else min(self._budget, self._lazy_spins)
        for i in range(budget):
            if ctr[r] >= v:
                self._budget += (min(self._spins, 2 * i + 10) - self._budget) // 8
                return
        self._budget += (min(self._spins, 2 * budget + 10) - self._budget) // 8
        for _ in range(self._yields):
            os.sched_yield()
            if ctr[r] >= v:
                return
        self._sleep_for(r, v)

    def _sleep_for(self, r: int, v: int) -> None:
        ctr, addr, sleepers = self._ctr, self._addr[r], self._sleepers
        start = time.monotonic()
        next_check = start + 0.05
        while True:
            sleepers[r] = 1  # before reading the counter: r, having written it, sees the flag and wakes us
            seen = int(ctr[r])
            if seen >= v:
                return
            if self._abort[0]:
                self._raise_aborted()
            # Bounded, so peer deaths and time-outs are noticed even with nobody to wake this rank.
            futex.wait(addr, seen, 0.01)
            if ctr[r] >= v:
                return
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.05
                late = [q for q in range(self.size) if ctr[q] < v]
                dead = [q for q in late if not process_alive(*self._peers[q])]
                if dead:
                    desc = ", ".join(f"{self._labels[q]} (pid {self._peers[q][0]})" for q in dead)
                    message = f"{desc} died during {self.what}; this rank cannot continue"
                    self.abort(message)
                    raise PeerLostError(message)
                if now - start > self._timeout:
                    message = (
                        f"{self.what} waited {self._timeout:g}s for "
                        + ", ".join(self._labels[q] for q in late)
                        + " inside the shared-memory transport; the peer is alive but stuck "
                        "(raise HORA_OP_TIMEOUT_SECONDS if it is just slow)"
                    )
                    self.abort(message)
                    raise CollectiveTimeoutError(message)

    def _raise_aborted(self) -> None:
        who = int(self._abort[0]) - 1
        raw = bytes(self._reason)
        reason = raw[: raw.index(0)].decode(errors="replace") if 0 in raw else raw.decode(errors="replace")
        name = self._labels[who] if 0 <= who < self.size else f"rank {who}"
        raise PeerLostError(f"{self.what} aborted because {name} failed: {reason}")

    def _typed(self, r: int, b: int, dtype: np.dtype) -> np.ndarray:
        return self._bufs[r][b].view(dtype)

    # -- collectives --------------------------------------------------------------------------------------------
    def allreduce(self, src: np.ndarray, dst: np.ndarray, op: int) -> None:
        self.allreduce_scaled(src, dst, op, 1.0)

    def allreduce_scaled(self, src: np.ndarray, dst: np.ndarray, op: int, post: float) -> None:
        # each owner scales its reduced slice in its slot, in cache, instead of a pass over dst afterwards
        self._reduce([src], [src.size], even_counts(src.size, self.size), op, [dst], None, post)

    def allreduce_fused(self, srcs: list[np.ndarray], dsts: list[np.ndarray], op: int) -> None:
        self.allreduce_fused_scaled(srcs, dsts, op, 1.0)

    def allreduce_fused_scaled(self, srcs: list[np.ndarray], dsts: list[np.ndarray], op: int, post: float) -> None:
        # The fusion buffer is this rank's slot: staging copies straight from the pieces, gathering straight into
        # them, so packing is the only copy and there is no full-size temporary.
        if srcs:
            ends = list(accumulate(s.size for s in srcs))
            self._reduce(srcs, ends, even_counts(ends[-1], self.size), op, dsts, None, post)

    def reducescatter(self, src: np.ndarray, dst: np.ndarray, counts: list[int], op: int) -> None:
        self._reduce([src], [src.size], counts, op, None, dst)

    def _reduce(
        self,
        srcs: list[np.ndarray],
        ends: list[int],
        counts: list[int],
        op: int,
        dsts: list[np.ndarray] | None,
        out: np.ndarray | None,
        post: float = 1.0,
    ) -> None:
        """Reduce the virtual concatenation of ``srcs`` (piece i ends at element ``ends[i]``), owner r taking the
        ``counts[r]`` elements at its offset, and multiply the result by ``post``; then copy every owner's slice
        into ``dsts`` (allreduce: the same pieces as ``srcs``) or this rank's slice into ``out`` (reduce-scatter)."""
        dt, me, size = srcs[0].dtype, self.rank, self.size
        cap = self._sub // dt.itemsize
        offs = offsets(counts)
        steps = -(-max(counts) // cap) if counts else 0
        widen = dt in HALF and size > 2
        if widen and self._scratch.size < cap:
            self._scratch = np.empty(cap, np.float32)
        # Unfused (one piece), ranges are plain slices of src and dst: no piece mapping on the hot small-array path.
        fused, src0 = len(srcs) > 1, srcs[0]
        for k in range(steps):
            b = self._next()
            views = [self._typed(r, b, dt) for r in range(size)]
            mine, lo = views[me], k * cap
            for r in range(size):
                m = min(cap, counts[r] - lo)
                if m > 0 and r != me:  # the owner reduces its own slice straight from src: one copy less
                    a, at = offs[r] + lo, r * cap
                    if fused:  # packing: the pieces go straight into the slot, in one call
                        np.concatenate(_parts(srcs, ends, a, m), out=mine[at : at + m])
                    else:
                        mine[at : at + m] = src0[a : a + m]
            self._barrier()
            m = min(cap, counts[me] - lo)
            seg = slice(me * cap, me * cap + max(m, 0))
            if m > 0:
                a = offs[me] + lo
                own = _parts(srcs, ends, a, m) if fused else [src0[a : a + m]]
                others = [views[j][seg] for j in range(size) if j != me]
                red = mine[seg]  # the owner's reduced slice goes to its slot, never to src (dst may be src)
                if widen:
                    acc = self._scratch[:m]
                    np.concatenate(own, out=acc)
                    for other in others:
                        reduce_into(acc, other, op)
                    red[...] = acc
                else:
                    if len(own) == 1:
                        combine(own[0], others[0], red, op)
                    elif m * dt.itemsize >= len(own) * _OWN_PIECE_BYTES:
                        pos = 0
                        for part in own:  # red = own (op) first, reading the pieces where they are
                            n = part.size
                            combine(part, others[0][pos : pos + n], red[pos : pos + n], op)
                            pos += n
                    else:  # many small pieces: packing them into the slot (one call) beats a ufunc call each
                        np.concatenate(own, out=red)
                        reduce_into(red, others[0], op)
                    for other in others[1:]:
                        reduce_into(red, other, op)
                if post != 1.0:
                    scale_into(red, post, red)
            if dsts is not None:
                self._barrier()  # every owner has reduced: copy out (only now, so dst may be src)
                for r in range(size):
                    m = min(cap, counts[r] - lo)
                    if m > 0:
                        a, at, view = offs[r] + lo, r * cap, views[r]
                        if fused:
                            for part in _parts(dsts, ends, a, m):
                                n = part.size
                                part[...] = view[at : at + n]
                                at += n
                        else:
                            dsts[0][a : a + m] = view[at : at + m]
            elif out is not None and m > 0:
                out[lo : lo + m] = mine[seg]

    def allgather(self, src: np.ndarray, dst: np.ndarray, counts: list[int]) -> None:
        me, chunk = self.rank, self._chunk
        offs = offsets(counts)
        steps = -(-max(counts) // chunk) if counts else 0
        for k in range(steps):
            b = self._next()
            lo = k * chunk
            m = min(chunk, counts[me] - lo)
            if m > 0:
                self._bufs[me][b][:m] = src[lo : lo + m]
            self._barrier()
            for r in range(self.size):
                m = min(chunk, counts[r] - lo)
                if m > 0:
                    dst[offs[r] + lo : offs[r] + lo + m] = (
                        src[lo : lo + m] if r == me else self._bufs[r][b][:m]
                    )

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        n, chunk = buf.size, self._chunk
        for k in range(-(-n // chunk)):
            b = self._next()
            lo = k * chunk
            m = min(chunk, n - lo)
            if self.rank == root:
                self._bufs[root][b][:m] = buf[lo : lo + m]
            self._barrier()
            if self.rank != root:
                buf[lo : lo + m] = self._bufs[root][b][:m]

    def alltoall(
        self, src: np.ndarray, send_counts: list[int], dst: np.ndarray, recv_counts: list[int], max_block: int
    ) -> None:
        me, cap = self.rank, self._sub
        sd, rd = offsets(send_counts), offsets(recv_counts)
        for k in range(-(-max_block // cap)):
            b = self._next()
            lo = k * cap
            mine = self._bufs[me][b]
            for r in range(self.size):
                m = min(cap, send_counts[r] - lo)
                if m > 0:
                    mine[r * cap : r * cap + m] = src[sd[r] + lo : sd[r] + lo + m]
            self._barrier()
            for j in range(self.size):
                m = min(cap, recv_counts[j] - lo)
                if m > 0:
                    dst[rd[j] + lo : rd[j] + lo + m] = self._bufs[j][b][me * cap : me * cap + m]
