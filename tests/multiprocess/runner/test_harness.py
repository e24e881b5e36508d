"""The multi-process harness turns a hang into a readable failure: every rank's stack, then a kill."""

from __future__ import annotations

import pytest

from hora.errors import RunError
from hora.runner import run
from support.harness import stderr_of
from workers.failures import hang_worker


def test_a_hang_ends_with_every_ranks_stack():
    with pytest.raises(RunError) as info:
        run(hang_worker, np=2, capture=True, timeout=5)
    result = info.value.result
    assert result.timed_out and result.exit_code == 124
    assert "exceeded its time limit" in str(info.value)
    for rank, where in ((0, "synchronize"), (1, "hang_worker")):
        err = stderr_of(result, rank)
        assert "Current thread" in err or "Thread 0x" in err, err  # faulthandler's dump
        assert where in err, err
