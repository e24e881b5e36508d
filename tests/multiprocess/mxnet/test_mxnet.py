"""hora.mxnet on real ranks: every op and dtype against numpy at N = 1, 2, 4; errors on every rank; process sets;
DistributedOptimizer; DistributedTrainer training on digits at N = 1, 2, 4 (accuracy within 0.5 points of one
process, weights bitwise equal across ranks); the example under hora run and as a hora job.

MXNet 1.9.1 imports only with numpy < 1.24, so these tests run in the second environment that .ci/run builds
(.venv-mxnet, numpy 1.23.5); in the main environment (numpy 2) they are skipped. MXNet costs about a second to
import in every rank, so one run per number of ranks does everything that number needs (``suite_worker``).

With a fixed global batch split over N ranks in order, N-rank training computes what 1-rank training computes up to
float rounding (the ranks sum their gradients, the optimizer divides by N times the local batch).
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 needs numpy<1.24: these tests run in .venv-mxnet, the second pass of .ci/run"
)
pytest.importorskip("sklearn")

from support.harness import run_ranks
from workers.mxnet_ops import suite_worker

ERRORS = [
    "shape", "dtype", "root", "reducescatter op", "sparse", "numpy input", "root out of range", "alltoall splits",
    "alltoall float splits", "alltoall uneven", "average and op", "adasum", "broadcast_parameters list",
    "trainer strategy", "optimizer strategy",
]  # fmt: skip


def _ops(n: int) -> int:
    """How many results ops_worker compares at n ranks: 7 numeric dtypes and bool, a broadcast per root."""
    return 7 * (16 + 4 + 2 * n) + (8 + 4 + 2 * n) + 7


def _check_errors(notes: list[str]) -> None:
    assert [x.split(":")[0] for x in notes] == ERRORS, notes
    assert "MismatchError" in notes[0] and "grad.fc1" in notes[0] and "(2, 1)" in notes[0], notes[0]
    assert "float32" in notes[1] and "float64" in notes[1], notes[1]
    assert "reducescatter" in notes[3] and "Average or op=Sum" in notes[3], notes[3]
    assert "row_sparse" in notes[4], notes[4]
    assert "NDArray" in notes[5], notes[5]
    assert "MXNetError" in notes[7] and "MXNetError" in notes[9], notes  # Horovod's type for its enqueue errors
    assert "32-bit integer" in notes[8] and "float32" in notes[8], notes[8]
    for note, what in zip(notes[13:15], ["DistributedTrainer", "DistributedOptimizer"]):
        assert f": UnsupportedError: hora.mxnet.{what} does not support strategy=" in note, note
        assert "it implements 'allreduce'; hora has no server rules for MXNet optimizers" in note, note


def _same_training(results: list[dict], one: dict) -> None:
    assert len({r["weights"] for r in results}) == 1, "weights differ across ranks (must be bitwise equal)"
    assert abs(results[0]["accuracy"] - one["accuracy"]) <= 0.005, (results[0], one)


@pytest.fixture(scope="module")
def one_rank():
    return run_ranks(suite_worker, 1, ["ops", "optimizer", "train"], timeout=240)[0]


def test_one_rank(one_rank):
    assert one_rank["ops"] == _ops(1), one_rank
    assert one_rank["optimizer"] == pytest.approx([0.5, 0.0, 1.0, 0.5, 0.5, -1.0, -1.0]), one_rank
    assert one_rank["train"]["accuracy"] > 0.9, one_rank


def test_two_ranks(one_rank):
    parts = ["ops", "errors", "optimizer", "optimizer:2", "train", "train:predivide", "train:groups", "train:fp16"]
    results = run_ranks(suite_worker, 2, parts, timeout=300)
    assert [r["ops"] for r in results] == [_ops(2)] * 2, results
    for r in results:
        _check_errors(r["errors"])
        # averaged gradients: [1.5, 3, 0] and [1.5, 1.5], [2, 2] with lr 0.5
        assert r["optimizer"] == pytest.approx([0.25, -0.5, 1.0, 0.25, 0.25, -1.0, -1.0]), r
        assert r["optimizer:2"] == r["optimizer"], "gradient_predivide_factor changed the result"
    for variant in ["train", "train:predivide", "train:groups"]:
        _same_training([r[variant] for r in results], one_rank["train"])
    fp16 = [r["train:fp16"] for r in results]  # float16 gradients: not what one process computes, but close
    assert fp16[0]["weights"] == fp16[1]["weights"] and fp16[0]["accuracy"] > 0.9, fp16


def test_four_ranks(one_rank):
    results = run_ranks(suite_worker, 4, ["ops", "errors", "sets", "train"], timeout=300)
    assert [r["ops"] for r in results] == [_ops(4)] * 4, results
    for r in results:
        _check_errors(r["errors"])
    notes = [r["sets"] for r in results]
    assert notes[0] == notes[2] == [] and len(notes[1]) == len(notes[3]) == 1 and "not a member" in notes[1][0], notes
    _same_training([r["train"] for r in results], one_rank["train"])
