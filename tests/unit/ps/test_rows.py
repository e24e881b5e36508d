"""Duplicate row ids are summed on the worker as ``np.add.at`` sums them, in order of appearance."""

from __future__ import annotations

import numpy as np
import pytest

from hora.ps.rows import sum_duplicates


@pytest.mark.parametrize("n, high", [(1, 5), (9, 3), (500, 50), (500, 100_000), (300, 2), (4096, 200_000)])
@pytest.mark.parametrize("with_first", [False, True])  # True: few repeats take the path without a sort
def test_sum_duplicates_equals_np_add_at(n, high, with_first):
    rng = np.random.default_rng(n + high)
    ids = rng.integers(0, high, n)
    grads = rng.standard_normal((n, 5)).astype(np.float32)
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    expected = np.zeros((len(uniq), 5), np.float32)
    np.add.at(expected, inverse, grads)
    got = sum_duplicates(inverse.reshape(-1), len(uniq), grads, first=first if with_first else None)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)  # the same order of additions: the same bits
