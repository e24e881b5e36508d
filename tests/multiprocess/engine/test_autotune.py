"""Autotune on real ranks: every rank switches to rank 0's points between the same two cycles, the results stay
exact through every switch (fusion threshold, cycle time, the cache off and on), the CSV log has Horovod's
columns, and a job that ends while tuning shuts down cleanly."""

from __future__ import annotations

from hora._engine.autotune import CSV_HEADER
from support.fakehosts import run_on_hosts
from support.harness import run_ranks
from workers.autotune import SHAPES, no_sklearn_worker, tuning_worker

TUNE = {"autotune": True, "autotune_warmup_samples": 1, "autotune_steps_per_sample": 2}


def test_every_rank_switches_at_the_same_cycle_and_results_stay_exact(tmp_path):
    np_ = 2  # three ranks: the test below
    log = tmp_path / "autotune.csv"
    results = run_ranks(
        tuning_worker, np_, 40, autotune_bayes_opt_max_samples=6, autotune_log_file=str(log), **TUNE
    )
    histories = [r["history"] for r in results]
    assert all(h == histories[0] for h in histories), histories
    # 6 points scored, the first being the starting one: 5 switches, and a sixth to the best unless it is the last
    assert len(histories[0]) in (5, 6), histories[0]
    cycles = [cycle for cycle, _ in histories[0]]
    assert cycles == sorted(set(cycles))
    assert results[0]["tuning"] is False  # rank 0 finished
    assert [r["checked"] for r in results] == [40 * len(SHAPES)] * np_
    lines = log.read_text().splitlines()
    assert lines[0] == CSV_HEADER
    assert len(lines) == 1 + 6 + 1  # header, one row per scored point, the chosen point
    for line in lines[1:]:
        ha, hg, cache, cycle_ms, fusion, score = line.split(",")
        assert ha in "01" and hg in "01" and cache in "01", line
        assert float(cycle_ms) >= 0 and int(fusion) >= 0 and float(score) > 0, line
    final = lines[-1].split(",")
    assert max(float(x.split(",")[-1]) for x in lines[1:-1]) == float(final[-1])


def test_across_hosts_hierarchical_is_tuned_and_switches_stay_in_step():
    # both hierarchical settings off: autotune still gets the hierarchical transport, to try them on
    off = {"hierarchical_allreduce": False, "hierarchical_allgather": False}
    results = run_on_hosts(tuning_worker, "a:2,b:2", 30, autotune_bayes_opt_max_samples=5, **off, **TUNE)
    assert results[0]["hierarchical"] is True and {r["transport"] for r in results} == {"hierarchical"}
    histories = [r["history"] for r in results]
    assert all(h == histories[0] for h in histories) and len(histories[0]) >= 4, histories
    assert [r["checked"] for r in results] == [30 * len(SHAPES)] * 4


def test_a_job_that_ends_while_tuning_shuts_down_cleanly():
    results = run_ranks(tuning_worker, 3, 7, autotune_bayes_opt_max_samples=50, **TUNE)
    assert results[0]["tuning"] is True  # still tuning when the job ended
    histories = [r["history"] for r in results]
    assert all(h == histories[0] for h in histories), histories
    assert [r["checked"] for r in results] == [7 * len(SHAPES)] * 3


def test_autotune_without_scikit_learn_fails_init_on_every_rank():
    results = run_ranks(no_sklearn_worker, 2, autotune=True)
    for r in results:
        assert "needs scikit-learn" in r, r
        assert "pip install -c constraints.txt -e '.[autotune]' in hora's checkout" in r, r
