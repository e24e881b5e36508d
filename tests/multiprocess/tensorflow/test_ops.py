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


@pytest.mark.parametrize(("np_", "modes"), [(1, MODES), (2, MODES), (3, ["eager"]), (4, ["eager"])])
def test_every_op_and_dtype(np_, modes):
    results = run_ranks(ops_worker, np_, modes, timeout=240)
    assert results[0] >= 180 * len(modes) and len(set(results)) == 1, results
