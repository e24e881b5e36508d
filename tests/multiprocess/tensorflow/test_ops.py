"""hora.tensorflow: Horovod's TensorFlow API on real ranks, eagerly, in tf.function and in v1 Sessions
(collectives, gradients, errors, process sets); Keras is in test_keras.py.

TensorFlow costs seconds to import in every rank, so each run batches many checks. The graph modes are the same
adapter code at any number of ranks, so they run at N=1 and 2; N=3 and 4 (uneven splits, every root) run eagerly.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from support.harness import run_ranks
from workers.tf_ops import MODES, ops_worker
from workers.tf_train import errors_worker, gradients_worker, process_set_worker


@pytest.mark.parametrize(("np_", "modes"), [(1, MODES), (2, MODES), (3, ["eager"]), (4, ["eager"])])
def test_every_op_and_dtype(np_, modes):
    results = run_ranks(ops_worker, np_, modes, timeout=240)
    assert results[0] >= 180 * len(modes) and len(set(results)) == 1, results


@pytest.mark.parametrize("np_", [2, 3])
def test_gradients_tapes_and_optimizer(np_):
    results = run_ranks(gradients_worker, np_, timeout=240)
    assert results[0] == 3 * 12 + 1 and len(set(results)) == 1, results


def test_errors_on_every_rank_and_at_build_time():
    for notes in run_ranks(errors_worker, 2, timeout=180):
        assert [n.split(":")[0] for n in notes] == [
            "eager shape", "function shape", "function dtype", "graph shape", "dtype", "adasum", "jit", "bool average",
        ], notes  # fmt: skip
        assert all(" FailedPreconditionError: " in n for n in notes[:4]), notes
        assert "shape" in notes[0] and "eager.shape" in notes[0], notes
        assert "complex64" in notes[4] and "Adasum" in notes[5], notes
        assert "jit_compile=True" in notes[6], notes


def test_process_sets():
    notes = run_ranks(process_set_worker, 3, timeout=180)
    assert notes[0] == notes[2] == [] and len(notes[1]) == 1 and "not a member" in notes[1][0], notes
