"""hora._dtypes.scale_into: Horovod's CPU ScaleBuffer, dtype by dtype (used for every pre- and post-scale)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hora._dtypes import scale_into


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64])
def test_integers_scale_in_float64_and_truncate_toward_zero(dtype):
    x = np.array([5, 7, 100, 0, 3] if dtype == np.uint8 else [5, -5, 7, -7, 100], dtype)
    out = np.empty_like(x)
    scale_into(x, 0.7, out)
    assert out.dtype == dtype
    assert out.tolist() == [int(v * 0.7) for v in x.tolist()]  # int() truncates toward zero, as C does


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_halves_scale_in_float32(dtype):
    x = np.array([3.0, 1.1, -7.5, 0.3], dtype)
    out = np.empty_like(x)
    scale_into(x, 0.1, out)
    want = (x.astype(np.float32) * np.float32(0.1)).astype(dtype)
    assert out.tobytes() == want.tobytes()
    if dtype == np.float16:  # scaling by the factor rounded to float16 (numpy's own loop) differs
        assert out.tobytes() != (x * np.float16(0.1)).tobytes()


def test_float32_scales_by_the_factor_as_float32_and_float64_in_float64():
    x = np.array([3.0, 1.1, -7.5], np.float32)
    out = np.empty_like(x)
    scale_into(x, 0.1, out)
    assert out.tobytes() == (x * np.float32(0.1)).tobytes()
    y = np.array([3.0, 1.1, -7.5])
    scale_into(y, 0.1, y)  # in place
    assert y.tolist() == [v * 0.1 for v in [3.0, 1.1, -7.5]]
