"""hora.jax on real ranks: every op and dtype eagerly and inside jax.jit (the same bits both ways), Horovod's
gradients through jax.grad, errors on every rank, process sets, DistributedOptimizer (optax), Keras 3 on the JAX
backend, and examples/jax_digits.py's training at N = 1, 2 (the script itself, under hora run), 4.

JAX costs seconds to import and to compile in every rank, so one run per number of ranks does everything that number
needs (``suite_worker``). Training: every rank takes its slice of the same global batch, so N-rank training computes
what 1-rank training computes up to float rounding: the test accuracy must match the 1-rank run's within 0.5
points, with weights bitwise equal across ranks.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from hora.runner import run_command
from support import paths
from support.harness import run_ranks
from workers.jax_suite import suite_worker

# Checked without importing them here: only the ranks import JAX (and Keras, which would import TensorFlow).
_MISSING = [m for m in ("jax", "optax", "sklearn") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")

EXAMPLES = str(paths.REPO / "examples")
OPS = 210  # checks per rank in the op matrix (eager and jit each), at least


def _run(n: int, parts: list[str], **settings) -> list[dict]:
    return run_ranks(suite_worker, n, parts, EXAMPLES, timeout=240, **settings)


def _same_training(results: list[dict], one: dict) -> None:
    assert len({r["train"]["digest"] for r in results}) == 1, "weights differ across ranks"
    assert abs(results[0]["train"]["accuracy"] - one["train"]["accuracy"]) <= 0.005, (results[0]["train"], one)


@pytest.fixture(scope="module")
def one_rank():
    return _run(1, ["ops", "gradients", "optimizer", "train"])[0]


def test_one_rank(one_rank):
    assert one_rank["ops"] >= OPS, one_rank["ops"]
    assert one_rank["gradients"] == 8
    errors = one_rank["optimizer"]["errors"]
    assert errors[0] == (
        "ValueError: hora.jax.DistributedOptimizer: gradient_predivide_factor=2.0 needs op=Average "
        "(it splits the averaging around the sum); got op=Sum. Leave gradient_predivide_factor at "
        "1.0 or use op=Average"
    )
    assert errors[1].startswith("ValueError: hora.jax.DistributedOptimizer: gradient_predivide_factor=2.0 needs ")
    assert "got op=Adasum" in errors[1], errors[1]
    assert errors[2].startswith(
        "UnsupportedError: hora.jax.DistributedOptimizer does not support "
        "strategy='parameter_server': it implements 'allreduce'; an optax transformation "
        "is a pure function"
    ), errors[2]
    assert errors[3].startswith("ValueError: hora.jax.DistributedOptimizer: 1 array(s) in groups are not leaves"), errors
    assert one_rank["train"]["accuracy"] > 0.9, one_rank["train"]


def _check_errors(notes: list[str], me: int) -> None:
    assert notes[0].startswith("MismatchError: ") and "eager.shape" in notes[0] and "shape" in notes[0], notes[0]
    assert "JaxRuntimeError" in notes[1] and "jit.shape" in notes[1] and "MismatchError" in notes[1], notes[1]
    assert notes[2].startswith("UnsupportedError: ") and "complex64" in notes[2], notes[2]
    assert notes[3].startswith("UnsupportedError: ") and "Adasum" in notes[3], notes[3]  # a NotImplementedError too
    assert notes[4].startswith("UnsupportedError: ") and "bool" in notes[4], notes[4]
    for note in [*notes[5:7], *notes[9:12]]:  # vmap, jit(vmap), vmap(jit), pmap, shard_map
        assert note.startswith("ValueError: hora.jax allreduce cannot run inside jax.vmap"), note
    assert "mapped axes ['d']" in notes[11], notes[11]
    assert "JaxRuntimeError" in notes[7] and "same first dimension on every rank" in notes[7], notes[7]
    assert "rank 0: 1, rank 1: 2" in notes[7], notes[7]
    assert notes[8].startswith("ValueError: alltoall with splits cannot run inside a JAX trace"), notes[8]


def test_two_ranks_ops_gradients_errors_sets_optimizer_and_keras():
    """Also Keras 3 fit on the JAX backend with hora.keras.DistributedOptimizer: Keras jits the train step, the
    reduction is a hora.jax callback inside it. (Training at 2 ranks: test_jax_digits_trains_on_two_ranks.)"""
    parts = ["ops", "gradients", "errors", "process_sets", "optimizer"]
    keras = importlib.util.find_spec("keras") is not None  # not imported here: it would import TensorFlow
    results = _run(2, [*parts, "keras"] if keras else parts, env={"KERAS_BACKEND": "jax"})
    assert results[0]["ops"] >= OPS and len({r["ops"] for r in results}) == 1, results
    assert [r["gradients"] for r in results] == [8, 8]
    for me, r in enumerate(results):
        _check_errors(r["errors"], me)
        assert len(r["process_sets"]) == 1 and "not a member" in r["process_sets"][0], r["process_sets"]
    if keras:
        fits = [r["keras"] for r in results]
        assert fits[0]["backend"] == "jax" and fits[0]["class"] == "Adam", fits[0]
        assert len({f["weights"] for f in fits}) == 1, "Keras weights differ across ranks"
        assert fits[0]["accuracy"] > 0.6, fits[0]


def test_four_ranks_ops_gradients_sets_and_training(one_rank):
    results = _run(4, ["ops", "gradients", "process_sets", "train"])
    assert results[0]["ops"] >= OPS and len({r["ops"] for r in results}) == 1, results
    assert all(r["gradients"] == 8 for r in results)
    assert all("not a member" in r["process_sets"][0] for r in results)
    _same_training(results, one_rank)


JAX_DIGITS = paths.REPO / "examples" / "jax_digits.py"
FINAL = re.compile(r"^final test accuracy: (\d\.\d+)$")


def test_jax_digits_trains_on_two_ranks(one_rank):
    """examples/jax_digits.py under hora run: its output, and the training of the 1-rank run (test_one_rank: the
    same arguments) up to float rounding, with replicas identical on both ranks."""
    command = [sys.executable, str(JAX_DIGITS), "--epochs", "4", "--seed", "0"]
    result = run_command(command, np=2, capture=True, timeout=180, cwd=str(paths.REPO))
    out = result.lines.get(0, {}).get("stdout", [])
    assert result.exit_code == 0, f"{result.report()}\n" + "\n".join(out + result.lines.get(0, {}).get("stderr", [])[-40:])
    epochs = [m for line in out if (m := re.match(r"^epoch +(\d+)  train loss (\d+\.\d+)  test accuracy (\d\.\d+)$", line))]
    assert [int(m.group(1)) for m in epochs] == [1, 2, 3, 4], out
    losses = [float(m.group(2)) for m in epochs]
    assert losses[-1] < losses[0] / 2, f"training loss barely fell: {losses}"
    finals = [float(m.group(1)) for line in out if (m := FINAL.match(line))]
    assert len(finals) == 1, out
    assert finals[0] >= 0.9
    assert abs(finals[0] - one_rank["train"]["accuracy"]) <= 0.005, (finals[0], one_rank["train"])
    assert "replicas identical on 2 ranks: yes" in out, out
    assert result.lines[1]["stdout"] == [], "only rank 0 should print"
