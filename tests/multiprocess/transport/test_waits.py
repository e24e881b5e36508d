"""The shared-memory transport's waits (spin, then sleep on the late peer's counter until it wakes the waiter):
right results at every group size and with more ranks than cores, and a stopped or killed peer still ends in a
clear error instead of a hang (the killed case: tests/multiprocess/engine/test_failures.py)."""

from __future__ import annotations

import pytest

from support.harness import run_failing, run_ranks
from workers.transports import stopped_peer_worker, waits_worker


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_collectives_meet_at_every_group_size(np_):
    assert run_ranks(waits_worker, np_, 60, transport="shm") == [180] * np_


def test_more_ranks_than_cores_still_agree():
    assert run_ranks(waits_worker, 8, 15, transport="shm", timeout=180) == [45] * 8


def test_a_stopped_peer_becomes_a_time_out_naming_it(tmp_path):
    result = run_failing(
        stopped_peer_worker, 3, str(tmp_path), 1, transport="shm", op_timeout=3, timeout=90, grace_period=3
    )
    for r in (0, 2):
        report = tmp_path / f"survivor.{r}"
        assert report.exists(), f"rank {r} did not end with hora's error:\n{result.report()}"
        text = report.read_text()
        assert "rank 1" in text and ("alive but stuck" in text or "Stall" in text), text
