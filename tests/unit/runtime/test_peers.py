"""What members of a group know of each other before they connect: Peer records, the Topology they give, and
which transport a group chooses."""

from __future__ import annotations

import dataclasses

import pytest

from hora._runtime.peers import Peer, Topology
from hora._runtime.transports import choose_transport
from hora.config import Config
from hora.errors import ConfigError


def _peers(hosts: str, hints: list[tuple[int | None, int | None]] | None = None) -> list[Peer]:
    names = hosts.split(",")
    hints = hints or [(None, None)] * len(names)
    return [Peer(h, 100 + r, 7, "127.0.0.1", 5000 + r, "k", hints[r], 64, 1024) for r, h in enumerate(names)]


def test_a_peer_survives_the_wire():
    p = Peer("a", 1, 2, "10.0.0.1", 3, "boot", (0, 2), 64, 1024)
    assert Peer.from_wire(p.to_wire()) == p


@pytest.mark.parametrize(
    ("hosts", "me", "expected"),
    [
        ("a,a,b,b", 3, (("a", "b"), ((0, 1), (2, 3)), 1, 2, 1, 2)),
        ("a,a,a,b", 3, (("a", "b"), ((0, 1, 2), (3,)), 0, 1, 1, 2)),
        ("a,a,a,b", 2, (("a", "b"), ((0, 1, 2), (3,)), 2, 3, 0, 1)),  # no other host has a local rank 2
        ("a,b,a,b", 2, (("a", "b"), ((0, 2), (1, 3)), 1, 2, 0, 2)),  # hosts in order of first appearance
    ],
)
def test_topology_from_hosts(hosts, me, expected):
    assert dataclasses.astuple(Topology.of(_peers(hosts), me, "hora")) == expected


def test_launcher_hints_that_disagree_with_the_hosts_are_an_error():
    peers = _peers("a,a", hints=[(0, 2), (0, 2)])
    with pytest.raises(ConfigError, match="rank 1 on a: launcher says local rank 0 of 2, hosts at the rendezvous give 1 of 2"):
        Topology.of(peers, 0, "torchrun")


@pytest.mark.parametrize(
    ("settings", "hosts", "size", "hierarchical", "expected"),
    [
        ({}, ["a"], 4, True, "shm"),
        ({}, ["a", "b"], 4, True, "hierarchical"),
        ({}, ["a", "b"], 2, True, "tcp"),  # one rank per host: the flat ring is the same algorithm
        ({}, ["a", "b"], 4, False, "tcp"),  # process sets keep the flat ring across hosts
        ({"hierarchical_allreduce": False, "hierarchical_allgather": False}, ["a", "b"], 4, True, "tcp"),
        ({"transport": "tcp"}, ["a"], 4, True, "tcp"),
    ],
)
def test_choose_transport(settings, hosts, size, hierarchical, expected):
    config = Config.resolve(env={}, overrides=settings)
    assert choose_transport(config, hosts, size, hierarchical) == expected


def test_shared_memory_across_hosts_is_refused():
    with pytest.raises(ConfigError, match="HORA_TRANSPORT=shm needs every rank on one host"):
        choose_transport(Config.resolve(env={}, overrides={"transport": "shm"}), ["a", "b"], 2)
