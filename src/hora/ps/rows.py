"""Summing the gradients of repeated row ids on the worker, so each row crosses the wire once."""

from __future__ import annotations

import numpy as np

__all__ = ["sum_duplicates"]


def sum_duplicates(
    inverse: np.ndarray,
    n: int,
    grads: np.ndarray,
    out: np.ndarray | None = None,
    first: np.ndarray | None = None,
) -> np.ndarray:
    """Row ``j`` of the result is the sum, in order of appearance, of the ``grads`` rows ``i`` with ``inverse[i] ==
    j``: the sums ``np.add.at`` gives (it adds to zeros, so only the sign of a zero sum can differ), without its
    per-element loop. The first occurrences are gathered at once, then the k-th repeats of every row are added in
    one vectorised step per k (a few very hot rows: ``np.add.at`` on their repeats only). Into ``out`` if given
    (shape ``(n, *row_shape)``). ``first``: where each row first appears (``np.unique``'s ``return_index``); with
    it, few repeats (the usual case of a batch from a large table) are added by one ``np.add.at`` on them alone,
    without sorting (0.2 instead of 0.8 ms for 8192 rows with 32 repeats)."""
    summed = np.empty((n, *grads.shape[1:]), grads.dtype) if out is None else out
    if n == len(inverse):  # no duplicates: a permutation
        summed[inverse] = grads
        return summed
    if first is not None and len(inverse) - n <= len(inverse) // 32:  # past that, the loop below is faster
        np.take(grads, first, axis=0, out=summed, mode="clip")
        repeat = np.ones(len(inverse), bool)
        repeat[first] = False
        rest = np.flatnonzero(repeat)  # in order of appearance, as np.add.at adds them
        np.add.at(summed, inverse[rest], grads[rest])
        return summed
    order = np.argsort(inverse, kind="stable")
    ranks = inverse[order]
    starts = np.flatnonzero(np.diff(ranks, prepend=-1))  # where each row's run begins in sorted order
    np.take(grads, order[starts], axis=0, out=summed, mode="clip")  # "raise" would buffer
    nth = np.arange(len(ranks)) - starts[ranks]  # 0 for a first occurrence, k for the k-th repeat
    repeats = int(nth.max())
    if repeats > 32:  # a few very hot rows: np.add.at on the repeats only
        rest = nth > 0
        np.add.at(summed, ranks[rest], grads[order[rest]])
        return summed
    for k in range(1, repeats + 1):
        sel = nth == k
        summed[ranks[sel]] += grads[order[sel]]
    return summed
