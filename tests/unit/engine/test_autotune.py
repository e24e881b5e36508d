"""Autotune's pure logic, in-process: samples and warm-up, the Bayesian search, the CSV log, the hand-over of a
point from rank 0's link to another rank's, and the clear failure without scikit-learn."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from hora._engine.autotune import CSV_HEADER, CYCLE_MAX_MS, FUSION_MAX, Autotuner, TunedPoint, TuneLink
from hora._engine.bayes import BayesianSearch, expected_improvement, require_gaussian_process
from hora._engine.messages import Kind, Request, Response
from hora.errors import ConfigError

try:  # scikit-learn sets KMP_* variables when imported: import it before the hygiene check snapshots the environment
    import sklearn  # noqa: F401
except ImportError:
    pass

START = TunedPoint(64 << 20, 1.0, True, False, False)


def grads(n=3, elements=256):
    return [Response(Request(Kind.ALLREDUCE, f"g{i}", "float32", (elements,))) for i in range(n)]


def tuner(tmp_path=None, warmup=1, steps=2, max_samples=4, cache=True):
    path = str(tmp_path / "at.csv") if tmp_path is not None else ""
    return Autotuner(START, warmup, steps, max_samples, 0.8, path, cache, False)


def begin(t, clock=0.0):
    """The first cycle that completes something only marks where the first sample begins (at its end)."""
    t.record(grads(), clock)
    t.end_cycle(clock)
    return clock


def run_sample(t, clock, steps=2, seconds=1.0):
    """``steps`` steps of three 1 KiB gradients over ``seconds``; returns the clock after it."""
    for _ in range(steps):
        t.record(grads(), clock)
        clock += seconds / steps
        t.end_cycle(clock)
    return clock


def test_warmup_is_discarded_then_each_sample_proposes_a_point_in_bounds(tmp_path):
    t = tuner(tmp_path)
    clock = run_sample(t, begin(t))  # warm-up: nothing proposed, nothing logged
    assert t.proposal is None and t.active
    clock = run_sample(t, clock)  # first scored sample: the starting point
    assert t.proposal is not None
    p = t.proposal
    assert 0 <= p.fusion_threshold <= FUSION_MAX and p.fusion_threshold % 4096 == 0
    assert 0 <= p.cycle_time_ms <= CYCLE_MAX_MS
    assert (p.hierarchical_allreduce, p.hierarchical_allgather) == (False, False)  # not tunable on one host
    run_sample(t, clock)  # between a decision and its switch nothing counts
    assert t.proposal is p
    lines = (tmp_path / "at.csv").read_text().splitlines()
    assert lines == [CSV_HEADER, START.csv(3 * 1024 * 2 / 1.0)]


def test_tuning_ends_on_the_best_point_and_logs_it_last(tmp_path):
    t = tuner(tmp_path, warmup=0, max_samples=4)
    clock, scores = begin(t), {}
    while t.active:
        seconds = 1.0 if t.point == START else 4.0  # the starting point is the fastest
        clock = run_sample(t, clock, seconds=seconds)
        scores[t.point] = 6144 / seconds
        if t.proposal is not None:
            t.applied(t.proposal, clock)
    assert t.point == START  # switched back to the best
    lines = (tmp_path / "at.csv").read_text().splitlines()
    assert lines[0] == CSV_HEADER and len(lines) == 1 + 4 + 1
    assert lines[-1] == START.csv(6144.0)


def test_a_log_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path, caplog):
    t = Autotuner(START, 0, 1, 2, 0.8, str(tmp_path / "no-such-dir" / "at.csv"), True, False)
    assert "cannot write its log" in caplog.text
    run_sample(t, begin(t), steps=1)
    assert t.proposal is not None  # tuning goes on


def test_a_sample_ends_when_one_name_completed_steps_per_sample_times():
    t = tuner(warmup=0, steps=3)
    begin(t)
    for clock in range(2):
        t.record(grads(), float(clock))
        t.end_cycle(float(clock) + 0.5)
    assert t.proposal is None
    t.record(grads(1), 2.0)  # g0 for the third time
    t.end_cycle(3.0)
    assert t.proposal is not None


def test_points_round_trip_the_wire_and_csv():
    p = TunedPoint(4096, 2.5, False, True, False)
    assert TunedPoint.from_wire(p.to_wire()) == p
    assert p.csv(123.0) == "1,0,0,2.500,4096,123.0"
    assert CSV_HEADER.split(",") == [
        "hierarchical_allreduce", "hierarchical_allgather", "cache_enabled", "cycle_time_ms",
        "tensor_fusion_threshold", "score",
    ]  # fmt: skip


def test_rank_zero_carries_its_point_and_every_link_switches_with_it():
    def settings():
        return SimpleNamespace(
            autotune=True, fusion_threshold=64 << 20, cycle_time=0.001, cache_capacity=16,
            autotune_warmup_samples=0, autotune_steps_per_sample=1, autotune_max_samples=5, autotune_noise=0.8,
            autotune_log="",
        )  # fmt: skip

    s0, s1 = settings(), settings()
    link0, link1 = TuneLink(0, s0, None), TuneLink(1, s1, None)
    assert link1.tuner is None and not link1.wants_round()
    link0.record(grads())  # the first sample begins here
    link0.after_cycle(0, s0, None)
    link0.record(grads())
    assert link0.after_cycle(1, s0, None) is None and link0.wants_round()  # a sample ended: a point to send
    link1.incoming(link0.outgoing())  # the full round of cycle 2
    p0, p1 = link0.after_cycle(2, s0, None), link1.after_cycle(2, s1, None)
    assert p0 is not None and p0 == p1 and not link0.wants_round()
    assert link0.history == link1.history == [(2, p0)]
    assert (s0.fusion_threshold, s0.cycle_time) == (s1.fusion_threshold, s1.cycle_time) == (
        p0.fusion_threshold, p0.cycle_time_ms / 1000.0,
    )  # fmt: skip


def test_bayesian_search_finds_the_peak_of_a_smooth_score():
    search = BayesianSearch(2, 1, noise=0.01, seed=1)

    def score(x):  # best at (0.3, 0.7) with the switch on
        return 10 - 20 * ((x[0] - 0.3) ** 2 + (x[1] - 0.7) ** 2) + 2 * x[2]

    for _ in range(20):
        x = search.ask()
        assert np.all((x >= 0) & (x <= 1)) and x[2] in (0.0, 1.0)
        search.tell(x, score(x))
    best, value = search.best()
    assert value > score(np.array([0.3, 0.7, 1.0])) - 0.5, (best, value)


def test_expected_improvement_prefers_higher_mean_and_more_doubt():
    ei = expected_improvement(np.array([0.0, 1.0, 0.0]), np.array([0.1, 0.1, 1.0]), best=0.5)
    assert ei[1] > ei[2] > ei[0] >= 0


def test_without_scikit_learn_autotune_fails_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    hint = r"pip install -c constraints.txt -e '\.\[autotune\]' in hora's checkout"
    with pytest.raises(ConfigError, match=r"needs scikit-learn .* " + hint):
        require_gaussian_process()
