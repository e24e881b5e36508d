"""hora.keras on real ranks: Keras 3 fit with DistributedOptimizer (TensorFlow backend) at N=1, 2, 4 computes what
1-rank training computes; the callbacks' effects; the optimizer's config round trip and a reload without hora."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
pytest.importorskip("sklearn")

from support.harness import run_ranks
from workers.keras_fit import callbacks_worker, fit_worker


@pytest.fixture(scope="module")
def one_rank():
    return run_ranks(fit_worker, 1, timeout=240)[0]


@pytest.mark.parametrize("np_", [2, 4])
def test_fit_matches_one_rank_with_identical_weights(np_, one_rank):
    results = run_ranks(fit_worker, np_, timeout=300)
    assert len({r["weights"] for r in results}) == 1, "weights differ across ranks"
    assert len({r["optimizer"] for r in results}) == 1, "optimizer state differs across ranks"
    assert one_rank["accuracy"] > 0.85, one_rank
    assert abs(results[0]["accuracy"] - one_rank["accuracy"]) <= 0.005, (results[0], one_rank)


def test_callbacks():
    results = run_ranks(callbacks_worker, 2, timeout=240)
    n = 2
    # warm-up over epochs 0 and 1 (per batch; the value logged is the last batch's: 4 batches an epoch), then
    # 0.1 * 0.5 ** epoch from epoch 2
    warm = [0.1 / n * ((e + 1 / 4 + 3 / 4) * (n - 1) / 2 + 1) for e in range(2)]
    for r in results:
        assert r["lr"] == pytest.approx([*warm, 0.1 * 0.25, 0.1 * 0.125], rel=1e-5), r["lr"]
    assert results[0]["val_logged"] == results[1]["val_logged"], "metrics were not averaged over the ranks"
    assert results[0]["wrote"] and not results[1]["wrote"], "only rank 0 writes the best checkpoint"
