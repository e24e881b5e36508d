"""Large result buffers are recycled only once nothing refers to them (hora._engine.outputs)."""

from __future__ import annotations

import numpy as np
import pytest

from hora._engine import outputs

N = outputs.RECYCLE_BYTES // 4  # float32 elements of one recycled buffer


@pytest.fixture(autouse=True)
def _empty_pool():
    outputs.clear()
    yield
    outputs.clear()


def test_a_dropped_result_gives_its_memory_back():
    a = outputs.new_array((N,), np.float32)
    where = a.ctypes.data
    del a
    assert outputs.new_array((N,), np.float32).ctypes.data == where


@pytest.mark.parametrize("keep", ["array", "view", "memoryview", "tensor"])
def test_memory_is_never_handed_out_while_anything_refers_to_it(keep):
    a = outputs.new_array((N,), np.float32)
    where = a.ctypes.data
    if keep == "tensor":
        torch = pytest.importorskip("torch")
        held = torch.from_numpy(a)
    else:
        held = {"array": a, "view": a[10:20], "memoryview": memoryview(a)}[keep]
    del a
    b = outputs.new_array((N,), np.float32)
    assert b.ctypes.data != where
    assert held is not None


def test_small_arrays_come_from_the_allocator_and_shapes_and_dtypes_are_kept():
    small = outputs.new_array((3, 4), np.int16)
    assert small.shape == (3, 4) and small.dtype == np.int16 and small.flags.owndata
    big = outputs.new_array((2, N // 2), np.float64)
    assert big.shape == (2, N // 2) and big.dtype == np.float64 and big.flags.c_contiguous
