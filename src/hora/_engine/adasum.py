"""Horovod's Adasum reduction (``op=hvd.Adasum``), on any transport: :func:`adasum_fused`.

Adasum combines two gradients ``a`` and ``b`` so that their common part counts once and their orthogonal parts add:

    a' = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient stays 1 when its vector's squared norm is below sqrt(DBL_MIN)). Over ``N`` ranks, a power of two,
the gradients combine pairwise up a binary tree: ranks ``r`` and ``r ^ 1`` first, then those pairs two by two, and
so on. As in Horovod's CPU implementation (``horovod/common/ops/adasum/adasum.h``: vector halving, distance doubling)
each level halves the slice of the buffer a rank works on: it swaps half of its slice with its neighbour
``rank ^ level`` (the first half stays with the lower rank), computes the dot product and both squared norms of its
half per tensor in float64, sums those partial values over the ranks that hold the other slices of the same two
vectors, and combines its half with the coefficients. The slices then travel back up the tree, so every rank ends
with the whole result. Each tensor of a fused or grouped request gets its own coefficients, as each fused entry does
in Horovod. Float32 and float64 combine in float64 and round once; float16 combines in float32 (Horovod's AVX path).

The pairwise swaps are transport alltoalls with one non-empty block, and the partial sums an allgather of three
float64 values per tensor and rank; every rank runs the same calls in the same order.
"""

from __future__ import annotations

import sys

import numpy as np

from hora._transport.base import Transport

__all__ = ["ADASUM_DTYPES", "adasum_fused"]

#: The dtypes Horovod's Adasum reduces.
ADASUM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: Below this squared norm a vector's coefficient stays 1 (Horovod's ``sqrt(DBL_MIN)``).
_TINY = float(np.sqrt(sys.float_info.min))


def adasum_fused(plane: Transport, srcs: list[np.ndarray], dsts: list[np.ndarray]) -> None:
    """Adasum of each tensor of ``srcs`` (1-D, one float dtype, the same sizes on every rank) across the ranks of
    ``plane`` (a power of two), into ``dsts`` (``dsts[i]`` may be ``srcs[i]``)."""
    size, rank = plane.size, plane.rank
    assert size & (size - 1) == 0, "the frontend refuses Adasum over a number of ranks that is not a power of two"
    buf = np.concatenate(srcs) if len(srcs) > 1 else srcs[0].copy()
    if size > 1 and buf.size:
        ends = np.cumsum([s.size for s in srcs])
        _reduce(plane, buf, np.concatenate(([0], ends)), size, rank)
    at = 0
    for d in dsts:
        d[...] = buf[at : at + d.size]
        at += d.size


def _reduce(plane: Transport, buf: np.ndarray, bounds: np.ndarray, size: int, rank: int) -> None:
    item = buf.dtype.itemsize
    levels = size.bit_length() - 1  # level d pairs ranks r and r ^ (1 << d)
    # every rank's slice [lo, hi) after each level, so that every rank knows every block size of each swap
    ranges = [[(0, buf.size)] * size]
    for depth in range(levels):
        nxt = []
        for r, (lo, hi) in enumerate(ranges[-1]):
            mid = lo + (hi - lo) // 2
            nxt.append((lo, mid) if r & (1 << depth) == 0 else (mid, hi))
        ranges.append(nxt)
    # down: halve the slice, combine the kept half with the neighbour's copy of it
    for depth in range(levels):
        lo, hi = ranges[depth][rank]
        klo, khi = ranges[depth + 1][rank]
        peer = rank ^ (1 << depth)
        send = buf[lo:klo] if klo > lo else buf[khi:hi]  # the half the neighbour keeps
        theirs = np.empty(khi - klo, buf.dtype)
        _swap(plane, peer, send, theirs, _largest(ranges[depth + 1]) * item)
        _combine(plane, buf, theirs, klo, khi, bounds, left=rank & (1 << depth) == 0, group=2 << depth)
    # up: the halves travel back, so every rank ends with every slice
    for depth in reversed(range(levels)):
        klo, khi = ranges[depth + 1][rank]
        lo, hi = ranges[depth][rank]
        olo, ohi = (khi, hi) if klo == lo else (lo, klo)  # the neighbour's half
        _swap(plane, rank ^ (1 << depth), buf[klo:khi].copy(), buf[olo:ohi], _largest(ranges[depth + 1]) * item)


def _largest(ranges: list[tuple[int, int]]) -> int:
    """The longest slice: in a swap each rank sends what its neighbour keeps (down) or what it kept (up)."""
    return max(hi - lo for lo, hi in ranges)


def _swap(plane: Transport, peer: int, send: np.ndarray, recv: np.ndarray, max_block: int) -> None:
    """Send ``send`` to ``peer`` and receive ``recv`` (contiguous) from it: an alltoall with one non-empty block.
    ``max_block``: the largest block any rank sends at this step, the same on every rank."""
    send_counts, recv_counts = [0] * plane.size, [0] * plane.size
    send_counts[peer], recv_counts[peer] = send.nbytes, recv.nbytes
    plane.alltoall(np.ascontiguousarray(send).view(np.uint8), send_counts, recv.view(np.uint8), recv_counts, max_block)


def _combine(
    plane: Transport,
    buf: np.ndarray,
    theirs: np.ndarray,
    klo: int,
    khi: int,
    bounds: np.ndarray,
    left: bool,
    group: int,
) -> None:
    """Combine ``buf[klo:khi]`` (this rank's half) with ``theirs`` (the neighbour's copy of it), tensor by tensor,
    with the dot products and norms of the whole vectors: the partial values of the ``group`` ranks that hold the
    slices of the same two vectors, summed."""
    mine = buf[klo:khi]
    n = len(bounds) - 1
    partial = np.zeros((n, 3), np.float64)  # dot, |left|^2, |right|^2 of each tensor's part in this slice
    parts: list[tuple[int, int] | None] = []
    for t in range(n):
        lo, hi = max(bounds[t], klo) - klo, min(bounds[t + 1], khi) - klo
        if hi <= lo:
            parts.append(None)
            continue
        a, b = mine[lo:hi].astype(np.float64), theirs[lo:hi].astype(np.float64)
        own, other = float(a @ a), float(b @ b)
        partial[t] = (a @ b, own, other) if left else (a @ b, other, own)
        parts.append((lo, hi))
    every = np.empty((plane.size, n, 3), np.float64)
    plane.allgather(partial.view(np.uint8).reshape(-1), every.view(np.uint8).reshape(-1), [partial.nbytes] * plane.size)
    start = plane.rank - plane.rank % group
    sums = every[start : start + group].sum(axis=0)
    work = np.float32 if buf.dtype == np.float16 else np.float64  # Horovod's arithmetic for each dtype
    for t, span in enumerate(parts):
        if span is None:
            continue
        dot, lnorm, rnorm = sums[t]
        lcoeff = 1.0 - dot / lnorm * 0.5 if lnorm >= _TINY else 1.0
        rcoeff = 1.0 - dot / rnorm * 0.5 if rnorm >= _TINY else 1.0
        acoeff, bcoeff = (lcoeff, rcoeff) if left else (rcoeff, lcoeff)
        lo, hi = span
        a, b = mine[lo:hi].astype(work), theirs[lo:hi].astype(work)
        mine[lo:hi] = work(acoeff) * a + work(bcoeff) * b
