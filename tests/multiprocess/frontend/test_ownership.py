"""Values hora returns own their memory: kept across later collectives, shutdown() and a re-init(), they still read
what the collective returned (issue 13, item 6: a SIGSEGV in numpy's repr of an array over released memory)."""

from __future__ import annotations

import pytest

from support.harness import run_ranks
from workers.ownership import numpy_worker, torch_worker


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_numpy_results_survive_later_calls_shutdown_and_reinit(transport):
    assert run_ranks(numpy_worker, 3, transport=transport, timeout=120) == [True] * 3


def test_torch_results_and_gradients_survive_later_calls_shutdown_and_reinit():
    pytest.importorskip("torch")
    assert run_ranks(torch_worker, 2, timeout=120) == [True] * 2
