"""hora.torch.DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state and SyncBatchNorm on real
ranks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.harness import run_failing, run_ranks, stderr_of  # noqa: E402
from workers.torch_ops import (  # noqa: E402
    OPTIMIZERS,
    mismatched_params_worker,
    optimizer_rules_worker,
    optimizer_state_worker,
    optimizer_worker,
    raising_backward_worker,
    single_process_reference,
    sync_batch_norm_worker,
)


@pytest.mark.parametrize(
    ("np_", "options"),
    [
        (2, {}),
        (3, {}),
        (4, {}),
        (2, {"backward_passes_per_step": 2}),
        (3, {"gradient_predivide_factor": 2.0}),
        (2, {"groups": 2}),
        (2, {"op": 1}),  # Sum: the reference below then needs a learning rate n times larger; checked separately
    ],
)
def test_ranks_stay_identical_and_match_one_process(np_, options):
    results = run_ranks(optimizer_worker, np_, 4, 5, options, timeout=120)
    assert all(r == results[0] for r in results), "parameters differ across ranks (must be bitwise equal)"
    if options.get("op") == 1:
        return
    passes = options.get("backward_passes_per_step", 1)
    ref = single_process_reference(4, 5, np_, passes)
    got = torch.tensor(results[0])
    torch.testing.assert_close(got, torch.tensor(ref), rtol=1e-5, atol=1e-5)


def test_fp16_compression_trains_close_to_fp32():
    from hora.torch import Compression

    fp16 = run_ranks(optimizer_worker, 2, 4, 5, {"compression": Compression.fp16}, timeout=120)
    assert fp16[0] == fp16[1]
    ref = torch.tensor(single_process_reference(4, 5, 2))
    torch.testing.assert_close(torch.tensor(fp16[0]), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_broadcast_optimizer_state(kind):
    assert run_ranks(optimizer_state_worker, 2, kind, timeout=120) == [True, True]


@pytest.mark.parametrize("np_", [2, 3])
def test_optimizer_rules(np_):
    for notes in run_ranks(optimizer_rules_worker, np_, timeout=120):
        assert len(notes) == 3, notes
        assert notes[0].startswith("zero_grad: optimizer.zero_grad() was called after loss.backward()")
        assert notes[1].startswith("twice: Gradients were computed more than backward_passes_per_step")
        assert notes[2].startswith("bad params: invalid params of type")


def test_mismatched_parameter_sets_fail_on_every_rank():
    results = run_ranks(mismatched_params_worker, 2, timeout=120)
    for r in results:
        assert r.startswith("ValueError: DistributedOptimizer: the ranks' parameters differ"), results
        assert "rank 1 has extra only.on.rank1 [3] float32" in r, results


def test_a_rank_raising_in_backward_fails_the_job_with_its_error():
    result = run_failing(raising_backward_worker, 2, timeout=120)
    assert "bad batch on rank 1" in stderr_of(result, 1)


@pytest.mark.parametrize(("np_", "shape"), [(1, (6, 3)), (2, (4, 3)), (3, (2, 3, 5)), (2, (2, 4, 3, 3))])
def test_sync_batch_norm_equals_batch_norm_on_the_global_batch(np_, shape):
    assert run_ranks(sync_batch_norm_worker, np_, shape, timeout=120) == [True] * np_


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_match_one_process(sparse_as_dense):
    from workers.torch_ops import sparse_reference, sparse_worker

    got = run_ranks(sparse_worker, 3, sparse_as_dense, timeout=120)
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(sparse_reference(3)), rtol=1e-5, atol=1e-6)
