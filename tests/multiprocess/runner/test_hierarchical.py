"""Hierarchical collectives across (fake) hosts: shared memory within a host, TCP rings across hosts.

The ranks of one job report different host names (HORA_HOSTNAME), so hora treats them as separate machines: one
shared-memory segment per host, TCP between hosts. Hierarchical and flat runs of the same collectives must give
the same results, on equal and unequal numbers of ranks per host and on hosts of one rank.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import workers.collectives as cw
from support.fakehosts import run_failing_on_hosts, run_on_hosts
from support.harness import Launch, Launches
from support.parts import Part
from workers.hierarchical import (
    compare_worker,
    killed_peer_worker,
    process_set_worker,
    settings_worker,
    stuck_worker,
    topology_worker,
)

LAYOUTS = ["a:2,b:2", "a:3,b:1", "a:2,b:1,c:1"]
SMALL = {"shm_chunk_bytes": 4096, "tcp_chunk_bytes": 4096}  # many steps even for small tensors


def _same(a: object, b: object, what: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), what
        for k in a:
            _same(a[k], b[k], f"{what} {k}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, what
        # the data are small whole numbers: every sum is exact in any order, so even floats agree bit for bit
        assert a.tobytes() == b.tobytes(), f"{what}: hierarchical and flat results differ"
    else:
        assert a == b, what


def test_one_rank_per_host_uses_the_flat_ring():
    """With one rank per host there is no step within a host: the flat ring is the same algorithm, minus overhead."""
    for info in (r.pop("info") for r in run_on_hosts(compare_worker, "a:1,b:1,c:1", **SMALL)):
        assert info["transport"] == "tcp" and info["plane"] == "TcpTransport", info


@pytest.mark.parametrize("spec", LAYOUTS)
def test_hierarchical_and_flat_give_identical_results(spec):
    n = len(spec.split(",")) if ":" not in spec else sum(int(p.split(":")[1]) for p in spec.split(","))
    hier = run_on_hosts(compare_worker, spec, **SMALL)
    flat = run_on_hosts(compare_worker, spec, hierarchical_allreduce=False, hierarchical_allgather=False, **SMALL)
    assert len(hier) == len(flat) == n
    for r in range(n):
        assert hier[r].pop("info") == {"transport": "hierarchical", "plane": "HierarchicalTransport",
                                       "hierarchical_allreduce": True, "hierarchical_allgather": True}
        assert flat[r].pop("info") == {"transport": "tcp", "plane": "TcpTransport", "hierarchical_allreduce": None,
                                       "hierarchical_allgather": None}
        noise_h, noise_f = hier[r].pop("noise"), flat[r].pop("noise")
        np.testing.assert_allclose(noise_h, noise_f, rtol=1e-5, atol=1e-5)
        _same(hier[r], flat[r], f"rank {r}")
        _same(hier[r], hier[0], f"rank {r} vs rank 0")


def test_hierarchical_with_default_chunks_on_interleaved_hosts():
    """Ranks alternate between hosts (0, 2 on a; 1, 3 on b), so host blocks are not contiguous in rank order."""
    hier = run_on_hosts(compare_worker, "a,b,a,b")
    flat = run_on_hosts(compare_worker, "a,b,a,b", transport="tcp")
    for r in range(4):
        assert hier[r].pop("info")["plane"] == "HierarchicalTransport"
        assert flat[r].pop("info")["plane"] == "TcpTransport"
        hier[r].pop("noise"), flat[r].pop("noise")
        _same(hier[r], flat[r], f"rank {r}")


SUITE = [cw.allreduce_worker, cw.allgather_worker, cw.broadcast_worker, cw.alltoall_worker, cw.reducescatter_worker,
         cw.async_order_worker, cw.object_worker]


@pytest.fixture(scope="module")
def two_hosts_of_two() -> Launches:
    """One launch on 2 hosts x 2 ranks for the single-host suite's workers (small chunks), join and process sets
    (default chunks): each part on a fresh group (support/parts.py)."""
    parts = [Part(f.__name__, f, settings=SMALL) for f in SUITE]
    parts += [Part("join", cw.join_worker, (int(cw.hvd.Average),)), Part("process_set", process_set_worker)]
    return Launches(Launch(4, parts, hosts="a:2,b:2", timeout=240))


@pytest.mark.parametrize("worker", SUITE, ids=lambda f: f.__name__)
def test_collective_suite_on_two_hosts_of_two(two_hosts_of_two, worker):
    """The single-host suite's self-checking workers, hierarchical across 2 hosts x 2 ranks."""
    assert all(two_hosts_of_two(worker.__name__))


@pytest.mark.parametrize("spec", ["a:2,b:2", "a:3,b:1"])
def test_join_contributes_zeros_across_hosts(two_hosts_of_two, spec):
    results = two_hosts_of_two("join") if spec == "a:2,b:2" else run_on_hosts(cw.join_worker, spec, int(cw.hvd.Average))
    assert results == [3] * 4


def test_process_set_across_hosts(two_hosts_of_two):
    assert all(two_hosts_of_two("process_set"))


def test_hora_run_flags_reach_the_workers():
    script = ("from hora.config import Config; c = Config.resolve(); "
              "print('FLAGS', c.hierarchical_allreduce, c.hierarchical_allgather)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORA_", "HOROVOD_"))}
    env["HOROVOD_HIERARCHICAL_ALLGATHER"] = "0"  # the Horovod name works; the flag beats it
    for flags, expected in [([], "FLAGS True False"),
                            (["--no-hierarchical-allreduce", "--hierarchical-allgather"], "FLAGS False True")]:
        proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "1", *flags, sys.executable, "-c", script],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert expected in proc.stdout, proc.stdout


def test_allreduce_only_hierarchical_and_allgather_only_hierarchical():
    for ar, ag in [(True, False), (False, True)]:
        results = run_on_hosts(compare_worker, "a:3,b:1", hierarchical_allreduce=ar, hierarchical_allgather=ag)
        for res in results:
            assert res["info"] == {"transport": "hierarchical", "plane": "HierarchicalTransport",
                                   "hierarchical_allreduce": ar, "hierarchical_allgather": ag}


TOPOLOGY = {
    # spec: per rank (local_rank, local_size, cross_rank, cross_size)
    "a:2,b:2": [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)],
    "a:3,b:1": [(0, 3, 0, 2), (1, 3, 0, 1), (2, 3, 0, 1), (0, 1, 1, 2)],
    "a:1,b:3": [(0, 1, 0, 2), (0, 3, 1, 2), (1, 3, 0, 1), (2, 3, 0, 1)],
    "a:1,b:1,c:1": [(0, 1, 0, 3), (0, 1, 1, 3), (0, 1, 2, 3)],
    "a,b,a,b": [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)],
}


@pytest.mark.parametrize("spec", list(TOPOLOGY))
def test_local_and_cross_ranks(spec):
    results = run_on_hosts(topology_worker, spec)
    homogeneous = len({ls for _, ls, _, _ in TOPOLOGY[spec]}) == 1
    for r, (info, (lr, ls, cr, cs)) in enumerate(zip(results, TOPOLOGY[spec])):
        assert (info["rank"], info["size"]) == (r, len(results))
        assert (info["local_rank"], info["local_size"], info["cross_rank"], info["cross_size"]) == (lr, ls, cr, cs), r
        assert info["homogeneous"] is homogeneous
        assert info["plane"] == ("TcpTransport" if spec == "a:1,b:1,c:1" else "HierarchicalTransport")  # 1 rank/host: flat


@pytest.mark.parametrize(
    ("flags", "plane"),
    [({}, "HierarchicalTransport"), ({"hierarchical_allreduce": False}, "HierarchicalTransport"),
     ({"hierarchical_allreduce": False, "hierarchical_allgather": False}, "TcpTransport"),
     ({"transport": "tcp"}, "TcpTransport")],
)
def test_settings_choose_the_plane(flags, plane):
    for info in run_on_hosts(settings_worker, "a:2,b:1", **flags):
        assert info["plane"] == plane


def test_settings_do_nothing_on_one_host():
    for info in run_on_hosts(settings_worker, "a:2"):
        assert info["transport"] == "shm" and info["plane"] == "ShmTransport"


@pytest.mark.parametrize(("spec", "victim"), [("a:2,b:2", 3), ("a:2,b:2", 1), ("a:3,b:1", 2), ("a:3,b:1", 3)])
def test_a_rank_killed_mid_collective_fails_every_rank(tmp_path, spec, victim):
    outcome = run_failing_on_hosts(
        killed_peer_worker, spec, str(tmp_path), victim, timeout=120, op_timeout=60, grace_period=3
    )
    assert outcome.returncodes[victim] == -9
    for r, code in enumerate(outcome.returncodes):
        if r == victim:
            continue
        report = tmp_path / f"survivor.{r}"
        assert code == 3 and report.exists(), f"rank {r} exited {code} without an error:\n{outcome.stderr[r]}"
        message = report.read_text()
        # PeerLostError from whoever noticed first; the others learn it from them (abort word, closed sockets)
        assert message.startswith("PeerLostError"), message
        assert "rank" in message and ("died" in message or "left" in message or "failed" in message), message


@pytest.mark.parametrize("victim", [3, 0])
def test_a_stuck_rank_times_out_on_every_host(tmp_path, victim):
    """A rank alive but stopped: its host-mate times out in shared memory, the other host through it (EOF)."""
    spec, n = "a:2,b:2", 4
    survivors = [r for r in range(n) if r != victim]

    def reported() -> bool:
        return all((tmp_path / f"survivor.{r}").exists() for r in survivors)

    outcome = run_failing_on_hosts(stuck_worker, spec, str(tmp_path), victim, timeout=120, stop_when=reported,
                                   op_timeout=3)
    for r in survivors:
        report = tmp_path / f"survivor.{r}"
        assert report.exists(), f"rank {r} never raised:\n{outcome.stderr[r]}"
        message = report.read_text()
        assert message.startswith(("CollectiveTimeoutError", "PeerLostError")), message
    texts = [(tmp_path / f"survivor.{r}").read_text() for r in survivors]
    # whoever waited on the stuck rank says so, naming it and its host
    assert any("TimeoutError" in t and f"rank {victim} (host {'a' if victim < 2 else 'b'})" in t for t in texts), texts
