"""hora.torch: Horovod's PyTorch API on real ranks (collectives, autograd, errors); the optimizer and helpers are in
test_torch_optimizer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.harness import run_ranks  # noqa: E402
from workers.torch_ops import (  # noqa: E402
    allreduce_worker,
    autograd_worker,
    cuda_worker,
    errors_worker,
    gather_bcast_worker,
    grouped_worker,
    process_set_worker,
    reinit_worker,
)


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_allreduce_every_dtype_op_and_form(np_):
    results = run_ranks(allreduce_worker, np_, timeout=240)
    assert results[0] > 150 and len(set(results)) == 1


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_grouped_collectives(np_):
    assert run_ranks(grouped_worker, np_) == [True] * np_


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_allgather_broadcast_alltoall_reducescatter_objects(np_):
    assert run_ranks(gather_bcast_worker, np_, timeout=120) == [True] * np_


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_autograd_through_collectives(np_):
    assert run_ranks(autograd_worker, np_) == [True] * np_


def test_mismatches_raise_on_every_rank():
    results = run_ranks(errors_worker, 2)
    for seen in results:
        assert len(seen) == 3, seen
        assert seen[0].startswith("MismatchError") and "bad.shape" in seen[0], seen
        assert seen[1].startswith("MismatchError") and "bad.dtype" in seen[1], seen
        assert "complex64" in seen[2], seen


def test_reinit_after_shutdown():
    assert run_ranks(reinit_worker, 2) == [[2, 2], [2, 2]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
def test_cuda_tensors_are_staged_through_host_memory():
    assert run_ranks(cuda_worker, 2) == [True, True]


# The two axes are independent (how sets are registered; which transport carries them): each value of each once.
@pytest.mark.parametrize(("static", "transport"), [(False, "shm"), (True, "tcp")])
def test_process_sets(static, transport):
    for notes in run_ranks(process_set_worker, 4, static, transport=transport, timeout=120):
        assert len(notes) == 1 and "is not a member of process set" in notes[0], notes
