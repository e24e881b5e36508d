"""hora.torch where it must give exactly Horovod 0.28's answers (issue 13, items 1-5), on real ranks.

torch costs seconds to import in every rank, so the workers run in one launch per number of ranks (``launches``,
support/parts.py), each on a fresh group; every test asserts on its own worker's results.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.harness import Launch, Launches  # noqa: E402
from support.parts import Part  # noqa: E402
from workers.torch_parity import (  # noqa: E402
    gradient_worker,
    optimizer_state_worker,
    scalar_reducescatter_worker,
    scale_worker,
    sparse_adam_reference,
    sparse_adam_worker,
)

SPARSE = [(2, False), (3, False), (2, True)]


def _parts(np_: int) -> list[Part]:
    """Every worker this module runs on ``np_`` ranks."""
    parts = [Part("scale", scale_worker), Part("gradient", gradient_worker),
             Part("scalar_reducescatter", scalar_reducescatter_worker)]
    if np_ == 2:
        parts.append(Part("optimizer_state", optimizer_state_worker))
    parts += [Part(f"sparse_adam {dense}", sparse_adam_worker, (dense,)) for n, dense in SPARSE if n == np_]
    return [Part(f"np{np_} {p.name}", p.fn, p.args) for p in parts]


@pytest.fixture(scope="module")
def launches() -> Launches:
    return Launches(*(Launch(n, _parts(n)) for n in (2, 3)))


@pytest.mark.parametrize("np_", [2, 3])
def test_scale_factors_on_every_dtype_match_horovod(launches, np_):
    assert launches(f"np{np_} scale") == [True] * np_


@pytest.mark.parametrize("np_", [2, 3])
def test_reducescatter_and_grouped_gradients_match_horovod(launches, np_):
    # Horovod 0.28: reducescatter's gradient is allgather(grad) * size for Sum, * 1 for Average, times the scale
    # factors; grouped_reducescatter the same per tensor (y and y * 2 both feed y: 1 + 2 = 3 times that);
    # grouped_allgather's is the average over ranks of the output gradient, this rank's rows.
    want = [[np_, 3 * np_], [1.0, 3.0], [np_ * 1.5, 3 * np_ * 1.5], [2.0, 1.0]]
    assert launches(f"np{np_} gradient") == [want] * np_


@pytest.mark.parametrize("np_", [2, 3])
def test_reducescatter_of_a_scalar_raises_on_every_rank(launches, np_):
    want = ["reducescatter", "grouped_reducescatter", "reducescatter", "grouped_reducescatter"]
    assert launches(f"np{np_} scalar_reducescatter") == [want] * np_


def test_broadcast_optimizer_state_before_any_backward(launches):
    want = ["distributed=False ok", "distributed=True ok", "partial state: 2 entries"]
    assert launches("np2 optimizer_state") == [want] * 2


@pytest.mark.parametrize(("np_", "sparse_as_dense"), SPARSE)
def test_sparse_gradients_reach_sparse_adam_sparse(launches, np_, sparse_as_dense):
    got = launches(f"np{np_} sparse_adam {sparse_as_dense}")
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(sparse_adam_reference(np_)), rtol=1e-5, atol=1e-6)
