"""hora.torch.DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state and SyncBatchNorm on real
ranks.

torch costs seconds to import in every rank, so the workers run in one launch per number of ranks (``launches``,
support/parts.py), each on a fresh group; every test asserts on its own worker's results. A rank raising in
backward fails its job, so that test has a launch of its own.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hora.torch import Compression  # noqa: E402
from support.harness import Launch, Launches, run_failing, stderr_of  # noqa: E402
from support.parts import Part  # noqa: E402
from workers.torch_ops import (  # noqa: E402
    OPTIMIZERS,
    adasum_training_reference,
    bucket_worker,
    elastic_single_rank_worker,
    mismatched_params_worker,
    optimizer_rules_worker,
    optimizer_state_worker,
    optimizer_worker,
    raising_backward_worker,
    single_process_reference,
    sparse_reference,
    sparse_worker,
    sync_batch_norm_worker,
)

IDENTICAL = [
    (2, {}),
    (3, {}),
    (4, {}),
    (2, {"backward_passes_per_step": 2}),
    (3, {"gradient_predivide_factor": 2.0}),
    (2, {"groups": 2}),
    (2, {"op": 1}),  # Sum: the reference below then needs a learning rate n times larger; checked separately
    (2, {"op": 2}),  # Adasum: the ranks' local steps combined (adasum_training_reference)
    (4, {"op": 2}),
]
SYNC_BATCH_NORM = [(1, (6, 3)), (2, (4, 3)), (3, (2, 3, 5)), (2, (2, 4, 3, 3))]
RULES = [2, 3]


def _parts(np_: int) -> list[Part]:
    """Every worker this module runs on ``np_`` ranks."""
    parts = [Part(f"identical {options}", optimizer_worker, (4, 5, options)) for n, options in IDENTICAL if n == np_]
    parts += [Part(f"sync_batch_norm {shape}", sync_batch_norm_worker, (shape,)) for n, shape in SYNC_BATCH_NORM
              if n == np_]
    if np_ == 1:
        parts.append(Part("elastic", elastic_single_rank_worker))
    if np_ in RULES:
        parts.append(Part("rules", optimizer_rules_worker))
    if np_ == 2:
        parts.append(Part("fp16", optimizer_worker, (4, 5, {"compression": Compression.fp16})))
        parts += [Part(f"optimizer_state {kind}", optimizer_state_worker, (kind,)) for kind in OPTIMIZERS]
        parts.append(Part("mismatched", mismatched_params_worker))
    if np_ == 3:
        parts += [Part(f"sparse {flag}", sparse_worker, (flag,)) for flag in (False, True)]
        parts.append(Part("buckets", bucket_worker))
        parts.append(Part("buckets per gradient", bucket_worker, (False, True)))
        parts.append(Part("buckets as views", bucket_worker, (True,)))
        parts.append(Part("buckets as views per gradient", bucket_worker, (True, True)))
    return [Part(f"np{np_} {p.name}", p.fn, p.args) for p in parts]


@pytest.fixture(scope="module")
def launches() -> Launches:
    return Launches(*(Launch(n, _parts(n)) for n in (1, 2, 3, 4)))


@pytest.mark.parametrize(("np_", "options"), IDENTICAL)
def test_ranks_stay_identical_and_match_one_process(launches, np_, options):
    results = launches(f"np{np_} identical {options}")
    assert all(r == results[0] for r in results), "parameters differ across ranks (must be bitwise equal)"
    if options.get("op") == 1:
        return
    passes = options.get("backward_passes_per_step", 1)
    ref = adasum_training_reference(4, 5, np_) if options.get("op") == 2 else single_process_reference(4, 5, np_, passes)
    got = torch.tensor(results[0])
    torch.testing.assert_close(got, torch.tensor(ref), rtol=1e-5, atol=1e-5)


def test_fp16_compression_trains_close_to_fp32(launches):
    fp16 = launches("np2 fp16")
    assert fp16[0] == fp16[1]
    ref = torch.tensor(single_process_reference(4, 5, 2))
    torch.testing.assert_close(torch.tensor(fp16[0]), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_broadcast_optimizer_state(launches, kind):
    assert launches(f"np2 optimizer_state {kind}") == [True, True]


@pytest.mark.parametrize("np_", RULES)
def test_optimizer_rules(launches, np_):
    for notes in launches(f"np{np_} rules"):
        assert len(notes) == 4, notes
        assert notes[0].startswith("zero_grad: optimizer.zero_grad() was called after loss.backward()")
        assert notes[1].startswith("twice: Gradients were computed more than backward_passes_per_step")
        assert notes[2].startswith("bad params: invalid params of type")
        assert notes[3].startswith("views: gradient_as_bucket_view=True needs the optimizer's buckets"), notes[3]
        assert "groups=2" in notes[3], notes[3]


def test_an_elastic_job_at_one_rank_steps_with_its_own_gradients(launches):
    assert launches("np1 elastic") == [True]


def test_mismatched_parameter_sets_fail_on_every_rank(launches):
    results = launches("np2 mismatched")
    for r in results:
        assert r.startswith("ValueError: DistributedOptimizer: the ranks' parameters differ"), results
        assert "rank 1 has extra only.on.rank1 [3] float32" in r, results


def test_a_rank_raising_in_backward_fails_the_job_with_its_error():
    result = run_failing(raising_backward_worker, 2, timeout=120)
    assert "bad batch on rank 1" in stderr_of(result, 1)


@pytest.mark.parametrize(("np_", "shape"), SYNC_BATCH_NORM)
def test_sync_batch_norm_equals_batch_norm_on_the_global_batch(launches, np_, shape):
    assert launches(f"np{np_} sync_batch_norm {shape}") == [True] * np_


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_match_one_process(launches, sparse_as_dense):
    got = launches(f"np3 sparse {sparse_as_dense}")
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(sparse_reference(3)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("when", ["", " per gradient"], ids=["at-backward-end", "per-gradient"])
def test_buckets_average_mixed_dtypes_and_unused_parameters(launches, when):
    assert launches(f"np3 buckets{when}") == [True, True, True]


@pytest.mark.parametrize("when", ["", " per gradient"], ids=["at-backward-end", "per-gradient"])
def test_gradients_living_in_their_buckets_give_the_same_averages(launches, when):
    assert launches(f"np3 buckets as views{when}") == [True, True, True]
