"""hora.torch: Horovod's PyTorch API on real ranks (collectives, autograd, errors); the optimizer and helpers are in
test_optimizer.py.

torch costs seconds to import in every rank, so the workers run in one launch per number of ranks and transport
(``launches``, support/parts.py), each on a fresh group; every test asserts on its own worker's results.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.harness import Launch, Launches, run_ranks  # noqa: E402
from support.parts import Part  # noqa: E402
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

# The two axes of process sets are independent (how sets are registered; which transport carries them): each value
# of each once.
PROCESS_SETS = [(False, "shm"), (True, "tcp")]


def _parts(np_: int, transport: str = "shm") -> list[Part]:
    """Every worker this module runs on ``np_`` ranks over ``transport``."""
    parts = []
    if transport == "shm":  # what the default ("auto") picks on one host
        parts += [Part("allreduce", allreduce_worker), Part("gather_bcast", gather_bcast_worker)]
        if np_ <= 3:
            parts += [Part("grouped", grouped_worker), Part("autograd", autograd_worker)]
        if np_ == 2:
            parts += [Part("errors", errors_worker), Part("reinit", reinit_worker)]
    if np_ == 4:
        parts += [Part(f"process_sets {static}", process_set_worker, (static,)) for static, t in PROCESS_SETS
                  if t == transport]
    return [Part(f"np{np_} {transport} {p.name}", p.fn, p.args) for p in parts]


@pytest.fixture(scope="module")
def launches() -> Launches:
    # the default transport at 1-3 ranks; shm named at 4, where the process-set test asks for it by name
    return Launches(*(Launch(n, _parts(n)) for n in (1, 2, 3)), Launch(4, _parts(4), {"transport": "shm"}),
                    Launch(4, _parts(4, "tcp"), {"transport": "tcp"}))


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_allreduce_every_dtype_op_and_form(launches, np_):
    results = launches(f"np{np_} shm allreduce")
    assert results[0] > 150 and len(set(results)) == 1


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_grouped_collectives(launches, np_):
    assert launches(f"np{np_} shm grouped") == [True] * np_


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_allgather_broadcast_alltoall_reducescatter_objects(launches, np_):
    assert launches(f"np{np_} shm gather_bcast") == [True] * np_


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_autograd_through_collectives(launches, np_):
    assert launches(f"np{np_} shm autograd") == [True] * np_


def test_mismatches_raise_on_every_rank(launches):
    results = launches("np2 shm errors")
    for seen in results:
        assert len(seen) == 3, seen
        assert seen[0].startswith("MismatchError") and "bad.shape" in seen[0], seen
        assert seen[1].startswith("MismatchError") and "bad.dtype" in seen[1], seen
        assert "complex64" in seen[2], seen


def test_reinit_after_shutdown(launches):
    assert launches("np2 shm reinit") == [[2, 2], [2, 2]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
def test_cuda_tensors_are_staged_through_host_memory():
    assert run_ranks(cuda_worker, 2) == [True, True]


@pytest.mark.parametrize(("static", "transport"), PROCESS_SETS)
def test_process_sets(launches, static, transport):
    for notes in launches(f"np4 {transport} process_sets {static}"):
        assert len(notes) == 1 and "is not a member of process set" in notes[0], notes
