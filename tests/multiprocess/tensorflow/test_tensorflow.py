"""hora.tensorflow and hora.keras on real ranks: every op and dtype eagerly, in tf.function and in v1 Sessions;
Horovod's gradients; errors on every rank; process sets; Keras 3 fit with DistributedOptimizer and the callbacks.

TensorFlow and Keras cost seconds to import in every rank, so one run per number of ranks does everything that
number needs (``suite_worker``). The graph modes are the same adapter code at any number of ranks, so they run at
N=2; N=1, 3 and 4 run the op matrix eagerly (uneven splits, every root).

Keras: with a fixed global batch split over N ranks in order and no shuffling, N-rank fit computes what 1-rank fit
computes up to float rounding, so the test accuracy must match the 1-rank run's within 0.5 points, with weights and
optimizer state bitwise equal across ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
pytest.importorskip("sklearn")

from support.harness import run_ranks
from workers.keras_fit import flavour_fit_worker
from workers.tf_ops import MODES
from workers.tf_train import suite_worker

ERRORS = ["eager shape", "function shape", "function dtype", "graph shape", "dtype", "adasum", "jit", "bool average",
          "tf1 adasum", "keras adasum", "tape strategy", "slices scale", "partial tape layers", "keras adasum servers"]
OPS_PER_MODE = 180


def _check_errors(notes: list[str]) -> None:
    assert [n.split(":")[0] for n in notes] == ERRORS, notes
    assert all(" FailedPreconditionError: " in n for n in notes[:4]), notes
    assert "shape" in notes[0] and "eager.shape" in notes[0], notes
    assert "complex64" in notes[4] and "Adasum" in notes[5], notes
    assert "jit_compile=True" in notes[6], notes
    assert notes[8] == "tf1 adasum: ValueError: Adasum does not support average_aggregated_gradients == True", notes
    assert notes[9].startswith(
        "keras adasum: UnsupportedError: The Adasum reduction does not currently support sparse tensors. As a "
        "workaround please pass sparse_as_dense=True to DistributedOptimizer"
    ), notes
    assert notes[10].startswith(
        "tape strategy: UnsupportedError: hora.tensorflow.DistributedGradientTape does not "
        "support strategy='parameter_server'"
    ), notes
    assert "UnsupportedError: allreduce of tf.IndexedSlices does not support prescale_factor" in notes[11], notes
    assert "ValueError: All local layers must be of tf.keras.layers.Layer type; got ResourceVariable" in notes[12], notes
    assert notes[13].endswith(
        "UnsupportedError: hora.keras.DistributedOptimizer: op=Adasum needs strategy='allreduce', "
        "not 'parameter_server'"
    ), notes


def _same_training(fits: list[dict], one: dict) -> None:
    assert len({r["weights"] for r in fits}) == 1, "weights differ across ranks"
    assert len({r["optimizer"] for r in fits}) == 1, "optimizer state differs across ranks"
    assert abs(fits[0]["accuracy"] - one["accuracy"]) <= 0.005, (fits[0], one)


def _check_partial(results: list[dict]) -> None:
    """PartialDistributedOptimizer / register_local_var (workers/keras_partial.py): per variant, the local kernel
    follows each rank's own gradients (so it differs across ranks) and the shared one the reduced gradients
    (bitwise equal across ranks), both as computed by hand."""
    parts = [r["partial"] for r in results]
    for variant in ("scaled", "sum", "unscaled", "accumulated"):
        got = [p[variant] for p in parts]
        for local, shared, want_local, want_shared in got:
            np.testing.assert_allclose(local, want_local, rtol=1e-5, atol=1e-6, err_msg=variant)
            np.testing.assert_allclose(shared, want_shared, rtol=1e-5, atol=1e-6, err_msg=variant)
        assert all(g[1] == got[0][1] for g in got), f"{variant}: the shared kernel differs across ranks"
        assert got[0][0] != got[1][0], f"{variant}: the local kernel is the same on every rank"
    for p in parts:
        assert len(p["errors"]) == 2, p["errors"]
        assert "all local layers must be of" in p["errors"][0] and "got object" in p["errors"][0], p["errors"]
        assert "op currently only supports Average and Sum" in p["errors"][1], p["errors"]


@pytest.fixture(scope="module")
def one_rank():
    return run_ranks(suite_worker, 1, ["eager"], ["data", "fit"], timeout=300)[0]


def test_one_rank(one_rank):
    assert one_rank["ops"] >= OPS_PER_MODE, one_rank
    assert one_rank["fit"]["accuracy"] > 0.85, one_rank
    assert one_rank["data"] == 10, one_rank  # PipeModeDataset: two epochs of five records


def test_two_ranks_every_mode_gradients_errors_fit_and_callbacks(one_rank):
    results = run_ranks(
        suite_worker, 2, MODES, ["gradients", "errors", "syncbn", "fit_callbacks", "partial"], timeout=400
    )
    assert results[0]["ops"] >= OPS_PER_MODE * 3 and len({r["ops"] for r in results}) == 1, results
    assert [r["gradients"] for r in results] == [3 * 16 + 1 + 2] * 2, results  # + TF1 aggregation, 2 modes
    for r in results:
        _check_errors(r["errors"])
        assert r["syncbn"] < 1e-5, r["syncbn"]
    fits = [r["fit_callbacks"] for r in results]
    _same_training(fits, one_rank["fit"])
    cbs = [f["callbacks"] for f in fits]
    n = 2
    # warm-up over epochs 0 and 1, per batch (the value logged is the last batch's, of 4), then 0.1 * 0.5 ** epoch
    warm = [0.1 / n * ((e + 3 / 4 + 1 / 4) * (n - 1) / 2 + 1) for e in range(2)]
    for r in cbs:
        assert r["lr"] == pytest.approx([*warm, 0.1 * 0.25, 0.1 * 0.125], rel=1e-5), r["lr"]
    assert cbs[0]["val_logged"] == cbs[1]["val_logged"], "metrics were not averaged over the ranks"
    assert cbs[0]["wrote"] and not cbs[1]["wrote"], "only rank 0 writes the best checkpoint"
    assert cbs[0]["accumulated"] == cbs[1]["accumulated"], "backward_passes_per_step: weights differ across ranks"
    _check_partial(results)


def test_three_ranks_gradients_and_process_sets():
    results = run_ranks(suite_worker, 3, ["eager"], ["gradients", "process_sets"], timeout=300)
    assert results[0]["ops"] >= OPS_PER_MODE and len({r["ops"] for r in results}) == 1, results
    assert [r["gradients"] for r in results] == [16 + 1 + 2] * 3, results
    notes = [r["process_sets"] for r in results]
    assert notes[0] == notes[2] == [] and len(notes[1]) == 1 and "not a member" in notes[1][0], notes


def test_four_ranks_ops_and_fit(one_rank):
    results = run_ranks(suite_worker, 4, ["eager"], ["fit"], timeout=400)
    assert results[0]["ops"] >= OPS_PER_MODE and len({r["ops"] for r in results}) == 1, results
    _same_training([r["fit"] for r in results], one_rank["fit"])


@pytest.mark.parametrize(
    ("env", "module", "backend"),
    [({"TF_USE_LEGACY_KERAS": "1"}, "tf_keras.", "tensorflow"), ({"KERAS_BACKEND": "torch"}, "keras.", "torch")],
    ids=["tf_keras", "keras3-torch"],
)
def test_fit_with_tf_keras_and_with_the_torch_backend(env, module, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    else:
        pytest.importorskip("tf_keras")
    results = run_ranks(flavour_fit_worker, 2, timeout=300, env=env)
    assert results[0]["module"].startswith(module) and results[0]["class"] == "Adam", results[0]
    assert results[0]["backend"] == backend, results[0]
    assert len({r["weights"] for r in results}) == 1, "weights differ across ranks"
    assert results[0]["accuracy"] > 0.6, results[0]
    assert all(r["local_variables"] == [True, True] for r in results), [r["local_variables"] for r in results]
    _check_partial(results)
    for r in results:  # op=Adasum: the gradients Adasum-reduced (Horovod's formula), in either flavour
        np.testing.assert_allclose(*r["adasum"], rtol=1e-6, atol=1e-6)
    if backend == "tensorflow":  # tf_keras: local aggregation over 2 passes; a subclass of a tf_keras optimizer
        n = 2
        mean = sum(r + 1 for r in range(n)) / n  # rank r's gradients are (r + 1) * g
        first = [1.0 - 0.5 * 3 * mean, 2.0 - 0.5 * 1 * mean]  # two calls summed ([3, 1]), applied on the second
        second = [first[0] - 0.5 * mean, first[1] - 0.5 * mean]
        want = [[1.0, 2.0, 1], [*first, 2], [*first, 3], [*second, 4]]
        for r in results:
            for mode in ("eager", "function"):
                np.testing.assert_allclose(r[f"aggregated_{mode}"], want, rtol=1e-6, err_msg=mode)
            assert r["subclass"] == ["MySGD", pytest.approx(-mean)], r["subclass"]
