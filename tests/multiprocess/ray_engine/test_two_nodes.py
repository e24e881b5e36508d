"""hora.ray on a 2-node Ray cluster on this machine (a head and a second raylet, each with 2 CPUs, started and
stopped here with Ray's own ``ray.cluster_utils.Cluster``): ranks and local ranks follow Ray's placement, and
collectives cross the nodes."""

from __future__ import annotations

import shutil

import pytest

ray = pytest.importorskip("ray")

from hora.ray import RayExecutor  # noqa: E402
from workers import engines  # noqa: E402

from .conftest import processes_under, ray_environment, settle  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    mp = pytest.MonkeyPatch()
    tmp = ray_environment(mp)
    cluster = None
    try:
        node = {"num_cpus": 2, "object_store_memory": 80 << 20}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "temp_dir": tmp})
        cluster.add_node(**node)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        mp.undo()
        left = settle(lambda: processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes outlived the cluster: {left}"


def test_pack_fills_one_node_then_the_next_and_collectives_cross_them(two_nodes):
    executor = RayExecutor(num_workers=4)  # PACK: 2 CPUs per node, so two ranks on each node
    executor.start()
    try:
        out = executor.run(engines.topology)
        hosts = [s.host for s in executor.states]
    finally:
        executor.shutdown()
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]  # two Ray nodes: two hora hosts
    assert [(r["rank"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in out] == [
        (0, 0, 2, 0, 2), (1, 1, 2, 0, 2), (2, 0, 2, 1, 2), (3, 1, 2, 1, 2),
    ]  # fmt: skip
    assert {r["sum"] for r in out} == {6.0}
    assert {r["transport"] for r in out} == {"hierarchical"}  # shared memory within a node, TCP across


def test_strict_spread_puts_one_rank_on_each_node(two_nodes):
    executor = RayExecutor(num_workers=2, placement_strategy="STRICT_SPREAD")
    executor.start()
    try:
        out = executor.run(engines.topology)
        hosts = [s.host for s in executor.states]
    finally:
        executor.shutdown()
    assert hosts[0] != hosts[1]
    assert [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in out] == [
        (0, 1, 0, 2), (0, 1, 1, 2),
    ]  # fmt: skip
    assert {r["sum"] for r in out} == {1.0}
