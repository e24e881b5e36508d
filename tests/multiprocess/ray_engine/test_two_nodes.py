"""hora.ray on a 2-node Ray cluster on this machine (a head and a second raylet, each with 2 CPUs, started and
stopped here with Ray's own ``ray.cluster_utils.Cluster``): ranks and local ranks follow Ray's placement, and
collectives cross the nodes."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from hora.ray import RayExecutor  # noqa: E402
from workers import engines  # noqa: E402


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
