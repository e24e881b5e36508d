"""The PyTorch examples run end to end as real multi-process jobs and do what their docstrings say they do.

The digits example runs once per size (1, 2, 4 ranks, ``digits``); the 2-rank run is also the one whose output and
checkpoint are checked in detail.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from hora.runner import RunResult, run_command  # noqa: E402
from support import paths  # noqa: E402

REPO = paths.REPO
DIGITS = REPO / "examples" / "pytorch_digits.py"
SYNTHETIC = REPO / "examples" / "pytorch_synthetic_benchmark.py"
FINAL = re.compile(r"^final test accuracy: (\d+\.\d\d)%$")
EPOCH = re.compile(r"^epoch +(\d+)  train loss (\d+\.\d+)  test accuracy +(\d+\.\d\d)%  lr (\d+\.\d+)$")
NUMBER = r"(\d+\.\d)"


def _run(script: Path, np_: int, *args: str) -> RunResult:
    """Run an example on ``np_`` ranks under a time limit; fail the test with every rank's output."""
    result = run_command([sys.executable, str(script), *args], np=np_, capture=True, timeout=120, cwd=str(REPO))
    if result.exit_code != 0:
        dump = "\n".join(f"--- rank {r} ---\n" + "\n".join(s["stdout"][-20:] + s["stderr"][-40:])
                         for r, s in sorted(result.lines.items()))
        pytest.fail(f"{script.name} -np {np_} exited with {result.exit_code}\n{result.report()}\n{dump}",
                    pytrace=False)
    return result


def _final_accuracy(result: RunResult) -> float:
    matches = [m for line in result.lines[0]["stdout"] if (m := FINAL.match(line))]
    assert len(matches) == 1, result.lines[0]["stdout"]
    return float(matches[0].group(1))


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Callable[[int], tuple[RunResult, Path]]:
    """examples/pytorch_digits.py at ``np_`` ranks (run once, when a test first asks): the run, and the checkpoint
    the 2-rank run saves. Both tests below read the 2-rank run; each test starts at most two runs, so each stays
    within the suite's per-test time limit.

    Rank r trains on examples r, r + size, ... of each epoch's shuffle, so with the global batch (batch_size * size
    = 32) and the scaled learning rate (lr * size = 0.05) held fixed, every size trains the same model up to
    floating-point rounding. (With a fixed per-rank batch instead, the larger sizes take fewer, larger steps and can
    end a few test examples apart.)
    """
    checkpoint = tmp_path_factory.mktemp("digits") / "digits.pt"
    runs: dict[int, RunResult] = {}

    def run(np_: int) -> tuple[RunResult, Path]:
        if np_ not in runs:
            extra = ("--checkpoint", str(checkpoint)) if np_ == 2 else ()
            runs[np_] = _run(DIGITS, np_, "--seed", "0", "--epochs", "8", "--batch-size", str(32 // np_),
                             "--lr", str(0.05 / np_), *extra)
        return runs[np_], checkpoint

    return run


def test_pytorch_digits_trains_on_two_ranks(digits):
    result, checkpoint = digits(2)
    out = result.lines[0]["stdout"]
    epochs = [EPOCH.match(line) for line in out[:-1]]
    assert all(epochs) and [int(m.group(1)) for m in epochs] == list(range(1, 9)), out
    losses = [float(m.group(2)) for m in epochs]
    assert losses[-1] < losses[0] / 4, f"training loss barely fell: {losses}"
    assert float(epochs[0].group(4)) == pytest.approx(0.05)  # --lr 0.025 scaled by size() == 2, after warm-up
    assert _final_accuracy(result) >= 90.0
    assert result.lines[1]["stdout"] == [], "only rank 0 should print"

    state = torch.load(checkpoint)
    assert state["epoch"] == 8
    assert set(state["model"]) >= {"conv1.weight", "fc2.bias"}
    assert len(state["optimizer"]["state"]) == len(state["model"])  # a momentum buffer per parameter


def test_pytorch_digits_accuracy_is_the_same_at_one_two_and_four_ranks(digits):
    accuracies = {np_: _final_accuracy(digits(np_)[0]) for np_ in (1, 2, 4)}
    assert min(accuracies.values()) >= 95.0, accuracies
    assert max(accuracies.values()) - min(accuracies.values()) <= 0.5, accuracies


@pytest.mark.parametrize("flags", [("--model", "cnn"), ("--model", "mlp", "--fp16-allreduce")],
                         ids=["cnn", "mlp-fp16"])
def test_pytorch_synthetic_benchmark_smoke(flags):
    result = _run(SYNTHETIC, 2, *flags, "--batch-size", "8", "--num-warmup-batches", "1",
                  "--num-batches-per-iter", "2", "--num-iters", "2")
    out = result.lines[0]["stdout"]
    assert out[0].startswith(f"Model: {flags[1]} ("), out
    iters = [line for line in out if re.fullmatch(rf"Iter #\d: {NUMBER} img/sec per worker", line)]
    assert len(iters) == 2, out
    assert re.fullmatch(rf"Img/sec per worker: {NUMBER} \+- {NUMBER}", out[-2]), out
    assert re.fullmatch(rf"Total img/sec on 2 worker\(s\): {NUMBER} \+- {NUMBER}", out[-1]), out
    assert result.lines[1]["stdout"] == [], "only rank 0 should print"
