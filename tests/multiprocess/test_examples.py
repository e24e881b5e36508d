"""The examples run end to end as real multi-process jobs and do what the README says they do."""

from __future__ import annotations

import re
import sys

import pytest

from hora.runner import RunResult, run_command
from support import paths

REPO = paths.REPO
DIGITS = REPO / "examples" / "numpy_digits.py"
FINAL = re.compile(r"^final test accuracy: (\d\.\d+)$")
EPOCH = re.compile(r"^epoch +(\d+)  train loss (\d+\.\d+)  test accuracy (\d\.\d+)  lr (\d+\.\d+)$")


def _run_digits(np_: int, *args: str) -> RunResult:
    """Run the digits example on ``np_`` ranks with a fixed seed; fail the test with every rank's output."""
    command = [sys.executable, str(DIGITS), "--seed", "0", *args]
    result = run_command(command, np=np_, capture=True, timeout=120, cwd=str(REPO))
    if result.exit_code != 0:
        dump = "\n".join(f"--- rank {r} ---\n" + "\n".join(s["stdout"][-20:] + s["stderr"][-40:])
                         for r, s in sorted(result.lines.items()))
        pytest.fail(f"numpy_digits.py -np {np_} exited with {result.exit_code}\n{result.report()}\n{dump}",
                    pytrace=False)
    return result


def _final_accuracy(result: RunResult) -> float:
    matches = [m for line in result.lines[0]["stdout"] if (m := FINAL.match(line))]
    assert len(matches) == 1, result.lines[0]["stdout"]
    return float(matches[0].group(1))


def test_numpy_digits_trains_on_two_ranks():
    result = _run_digits(2, "--epochs", "5")
    out = result.lines[0]["stdout"]
    epochs = [EPOCH.match(line) for line in out[:-1]]
    assert all(epochs) and [int(m.group(1)) for m in epochs] == [1, 2, 3, 4, 5], out
    losses = [float(m.group(2)) for m in epochs]
    assert losses[-1] < losses[0] / 4, f"training loss barely fell: {losses}"
    assert float(epochs[-1].group(4)) == pytest.approx(0.1)  # --lr 0.05 scaled by size() == 2
    assert _final_accuracy(result) >= 0.9
    assert result.lines[1]["stdout"] == [], "only rank 0 should print"


# np=2 is test_numpy_digits_trains_on_two_ranks: the same command, and it asserts the same accuracy.
@pytest.mark.parametrize("np_", [1, 3], ids=lambda n: f"np{n}")
def test_numpy_digits_accuracy_holds_across_sizes(np_):
    # np=3 gives shards of unequal length (480, 479, 479): the ranks must agree on the step count or hang.
    accuracy = _final_accuracy(_run_digits(np_, "--epochs", "5"))
    assert accuracy >= 0.9


# examples/jax_digits.py on two ranks: tests/multiprocess/jax/test_jax.py (beside the 1-rank run it must match).
