"""hora._strategy's pure logic: resolving the strategy arguments, and the hybrid exchange's row bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from hora._strategy import check_mode, cover_shards, resolve_consistency, resolve_strategy, touched_rows
from hora.errors import ConfigError, UnsupportedError


class _Client:
    def __init__(self, mode: str, staleness: int) -> None:
        self.mode, self.staleness = mode, staleness


def test_the_argument_wins_and_the_default_is_allreduce_without_init():
    assert resolve_strategy(None) == "allreduce"
    assert resolve_strategy("hybrid") == "hybrid"
    with pytest.raises(
        UnsupportedError,
        match="opt does not support strategy='hybrid': it implements 'allreduce', 'parameter_server'; use Y",
    ):
        resolve_strategy("hybrid", ("allreduce", "parameter_server"), what="opt", instead="use Y")
    with pytest.raises(ValueError, match="strategy must be one of 'allreduce', 'parameter_server', 'hybrid'; got 'x'"):
        resolve_strategy("x")


@pytest.mark.parametrize(
    ("client", "staleness", "consistency", "want"),
    [
        (("async", 0), None, None, "async"),
        (("bounded", 3), None, None, "bounded(3)"),
        (("async", 0), 2, None, "bounded(2)"),
        (("async", 0), 2, "bounded", "bounded(2)"),
        (("async", 0), None, "sync", "sync"),
        (("sync", 0), None, "bounded:4", "bounded(4)"),
    ],
)
def test_consistency_from_the_arguments_else_the_setting(client, staleness, consistency, want):
    assert resolve_consistency(_Client(*client), staleness, consistency) == want


def test_conflicting_or_bad_consistency_arguments_are_refused():
    with pytest.raises(ConfigError, match=r"consistency='bounded\(3\)' and staleness=2 disagree"):
        resolve_consistency(_Client("async", 0), 2, "bounded(3)")
    with pytest.raises(ConfigError, match="staleness must be a non-negative int"):
        resolve_consistency(_Client("async", 0), -1, None)
    with pytest.raises(ConfigError, match="consistency 'sync' has no staleness"):
        resolve_consistency(_Client("async", 0), 2, "sync")
    with pytest.raises(ConfigError, match=r"strategy='hybrid' with consistency bounded\(1\)"):
        check_mode("bounded(1)")
    assert check_mode("sync") == "sync" and check_mode("async") == "async"


def test_touched_rows_sums_repeated_ids():
    ids, rows = touched_rows(np.array([5, 1, 5, 3]), np.array([[1.0], [2.0], [10.0], [4.0]], np.float32))
    np.testing.assert_array_equal(ids, [1, 3, 5])
    np.testing.assert_array_equal(rows, [[2.0], [4.0], [11.0]])
    ids, rows = touched_rows(np.array([], np.int64), np.zeros((0, 2), np.float32))
    assert ids.shape == (0,) and rows.shape == (0, 2)


def test_cover_shards_adds_one_zero_row_where_others_touched_a_shard_and_this_worker_did_not():
    placement = [(0, 10, 0), (10, 20, 1), (20, 30, 0)]
    mine, rows = np.array([2, 3]), np.ones((2, 4), np.float32)
    union = np.array([2, 3, 12, 15])  # another worker touched shard 1; nobody touched shard 2
    ids, out = cover_shards(placement, mine, rows, union)
    np.testing.assert_array_equal(ids, [2, 3, 12])
    np.testing.assert_array_equal(out[2], np.zeros(4))
    np.testing.assert_array_equal(out[:2], rows)
    same_ids, same_rows = cover_shards(placement, union, np.ones((4, 4), np.float32), union)
    assert same_ids is union and same_rows.shape == (4, 4)  # touched every touched shard: nothing added
