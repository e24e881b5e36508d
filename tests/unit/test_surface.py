"""hora._frontend.surface's names that need no running job: ProcessSet's ranks (Horovod's
horovod/common/process_sets.py: any iterable, sorted; anything else a ValueError) and the arguments init() refuses
before it starts anything."""

from __future__ import annotations

import numpy as np
import pytest

import hora.numpy as hvd
from hora.errors import UnsupportedError


@pytest.mark.parametrize(
    "ranks", [[2, 0], (2, 0), range(0, 3, 2), reversed([0, 2]), iter([2, 0]), {2, 0}, np.array([2, 0])],
    ids=["list", "tuple", "range", "reversed", "iterator", "set", "ndarray"],
)
def test_a_process_set_takes_any_iterable_of_ranks_sorted(ranks):
    ps = hvd.ProcessSet(ranks)
    assert ps.ranks == [0, 2] and all(type(r) is int for r in ps.ranks)
    assert ps.process_set_id is None and ps.size() is None and ps.rank() is None


@pytest.mark.parametrize(
    ("given", "words"),
    [(3, "got int 3"), (None, "got NoneType"), ([0, 1.5], "1.5 is a float"), ("01", "'0' is a str")],
)
def test_a_process_set_of_anything_else_is_a_value_error(given, words):
    with pytest.raises(ValueError, match="ProcessSet should be initialized with a list of process ranks") as e:
        hvd.ProcessSet(given)
    assert words in str(e.value)


def test_init_refuses_a_communicator_and_unknown_process_sets_before_starting():
    with pytest.raises(UnsupportedError, match=r"init\(comm=\.\.\.\) is not supported"):
        hvd.init(comm=[0, 1])
    with pytest.raises(ValueError, match="'dynamic'"):
        hvd.init(process_sets="static")
    with pytest.raises(ValueError, match="'x' is a str"):
        hvd.init(process_sets=[["x"]])
    assert not hvd.is_initialized()
