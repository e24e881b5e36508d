"""``hora run --num-ps S``: S servers beside the N workers, not ranks; gone with the job; and the torch optimizer
switched to parameter servers by one setting."""

from __future__ import annotations

import numpy as np
import pytest

from support.harness import run_failing, run_ranks, stderr_of
from workers.ps import killed_server_worker, push_pull_worker, torch_ps_worker, torch_reference


def test_servers_start_beside_the_workers_and_are_not_ranks():
    results = run_ranks(push_pull_worker, 3, 4, timeout=120, num_ps=2)
    for r in results:
        assert r["size"] == 3 and r["servers"] == 2
        np.testing.assert_array_equal(r["value"], np.full((10, 3), 4 * (1 + 2 + 3)))
        assert [s for _, _, s in r["placement"]] == [0, 1]
        assert r["balance"]["max_over_mean"] == 1.0
    # the hygiene fixture checks that no server process is left behind


@pytest.mark.parametrize("how", ["argument", "setting"])
def test_torch_optimizer_on_parameter_servers_matches_the_sync_reference(how):
    pytest.importorskip("torch")
    steps, workers = 3, 2
    if how == "argument":
        results = run_ranks(torch_ps_worker, workers, steps, "sync", timeout=120, num_ps=1)
    else:  # no code change: hora run --strategy parameter_server --ps-consistency sync
        results = run_ranks(torch_ps_worker, workers, steps, None, timeout=120, num_ps=1,
                            strategy="parameter_server", ps_consistency="sync")  # fmt: skip
    assert results[0] == results[1]
    assert results[0][-1] == 1.0
    np.testing.assert_allclose(results[0][:-1], torch_reference(steps, workers), rtol=1e-6, atol=1e-6)


def test_a_killed_server_fails_every_worker_naming_it_and_nothing_is_left_running():
    result = run_failing(killed_server_worker, 2, timeout=120, num_ps=2)
    for rank in range(2):
        err = stderr_of(result, rank)
        assert "PeerLostError" in err and "parameter server 0" in err and "'emb' shard 0" in err, err[-2000:]
    # the root cause is the server, not a worker that failed for want of it (issue 27, item 12)
    rc = result.root_cause
    assert rc is not None and rc.label == "parameter server 0" and rc.describe() == "killed by SIGKILL", result.report()
    report = result.report()
    assert "hora run: parameter server 0 failed first" in report and "what  : parameter server 0" in report
    assert result.exit_code == 128 + 9
    # the hygiene fixture checks that the surviving server was stopped with the job
