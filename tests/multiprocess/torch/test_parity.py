"""hora.torch where it must give exactly Horovod 0.28's answers (issue 13, items 1-5), on real ranks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.harness import run_ranks  # noqa: E402
from workers.torch_parity import (  # noqa: E402
    gradient_worker,
    optimizer_state_worker,
    scalar_reducescatter_worker,
    scale_worker,
    sparse_adam_reference,
    sparse_adam_worker,
)


@pytest.mark.parametrize("np_", [2, 3])
def test_scale_factors_on_every_dtype_match_horovod(np_):
    assert run_ranks(scale_worker, np_, timeout=240) == [True] * np_


@pytest.mark.parametrize("np_", [2, 3])
def test_reducescatter_and_grouped_gradients_match_horovod(np_):
    # Horovod 0.28: reducescatter's gradient is allgather(grad) * size for Sum, * 1 for Average, times the scale
    # factors; grouped_reducescatter the same per tensor (y and y * 2 both feed y: 1 + 2 = 3 times that);
    # grouped_allgather's is the average over ranks of the output gradient, this rank's rows.
    want = [[np_, 3 * np_], [1.0, 3.0], [np_ * 1.5, 3 * np_ * 1.5], [2.0, 1.0]]
    assert run_ranks(gradient_worker, np_) == [want] * np_


@pytest.mark.parametrize("np_", [2, 3])
def test_reducescatter_of_a_scalar_raises_on_every_rank(np_):
    want = ["reducescatter", "grouped_reducescatter", "reducescatter", "grouped_reducescatter"]
    assert run_ranks(scalar_reducescatter_worker, np_) == [want] * np_


def test_broadcast_optimizer_state_before_any_backward():
    want = ["distributed=False ok", "distributed=True ok", "partial state: 2 entries"]
    assert run_ranks(optimizer_state_worker, 2, timeout=120) == [want] * 2


@pytest.mark.parametrize(("np_", "sparse_as_dense"), [(2, False), (3, False), (2, True)])
def test_sparse_gradients_reach_sparse_adam_sparse(np_, sparse_as_dense):
    got = run_ranks(sparse_adam_worker, np_, sparse_as_dense, timeout=120)
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(sparse_adam_reference(np_)), rtol=1e-5, atol=1e-6)
