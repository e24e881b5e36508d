"""Parsing -H host:slots and checking it against -np."""

from __future__ import annotations

import socket

import pytest

from hora.errors import ConfigError
from hora.runner import host_list, resolve_hosts
from hora.runner.hosts import HostSlots, assign_ranks, is_local_host, parse_hostfile, parse_hosts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:4", [HostSlots("localhost", 4)]),
        ("a:2,b:3", [HostSlots("a", 2), HostSlots("b", 3)]),
        ("a", [HostSlots("a", 1)]),
        ("a,b:2", [HostSlots("a", 1), HostSlots("b", 2)]),
        (" a:2 , b:3 ,", [HostSlots("a", 2), HostSlots("b", 3)]),
        ("node-01.cluster:16", [HostSlots("node-01.cluster", 16)]),
        ("[::1]:2", [HostSlots("::1", 2)]), ("::1:2", [HostSlots("::1:2", 1)]),
    ],
)
def test_parse_hosts(text, expected):
    assert parse_hosts(text) == expected


@pytest.mark.parametrize("text", ["a:0", "a:x", "a:-1", "a:", ":4", "a:1.5", "a:2,b:0"])
def test_parse_hosts_rejects_bad_entries(text):
    with pytest.raises(
        ConfigError,
        match=r"-H entry '.*' is not host:slots with slots >= 1 \(e\.g\. -H localhost:4,node2:4\)",
    ):
        parse_hosts(text)


def test_parse_hosts_names_the_bad_entry():
    with pytest.raises(ConfigError, match=r"^-H entry 'b:x' is not host:slots"):
        parse_hosts("a:2,b:x")


@pytest.mark.parametrize("text", ["a:2,a:3", "a,b,a"])
def test_parse_hosts_rejects_duplicates(text):
    with pytest.raises(ConfigError, match=r"^-H names host 'a' twice$"):
        parse_hosts(text)


@pytest.mark.parametrize("text", ["", " ", ",", " , ,"])
def test_parse_hosts_rejects_empty(text):
    with pytest.raises(ConfigError, match=r"^-H is empty; give host:slots entries, e\.g\. -H localhost:4$"):
        parse_hosts(text)


def test_parse_hosts_bare_ipv6_loopback():
    assert parse_hosts("::1") == [HostSlots("::1", 1)]


def test_parse_hosts_non_ascii_digit_is_a_config_error():
    with pytest.raises(ConfigError):
        parse_hosts("a:\u00b2")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.1.1", "::1", socket.gethostname()])
def test_is_local_host(host):
    assert is_local_host(host)


def test_remote_is_not_local():
    assert not is_local_host("remote-node.invalid")


def test_resolve_np_defaults_to_slot_total():
    assert resolve_hosts(None, "localhost:4") == (4, "localhost")
    assert resolve_hosts(None, "localhost:2,127.0.0.1:3") == (5, "localhost")


def test_resolve_accepts_host_slot_objects():
    assert resolve_hosts(None, [HostSlots("localhost", 3)]) == (3, "localhost")


def test_resolve_np_within_slots():
    assert resolve_hosts(2, "localhost:4") == (2, "localhost")
    assert resolve_hosts(4, "localhost:4") == (4, "localhost")


def test_resolve_np_without_hosts():
    assert resolve_hosts(3, None) == (3, "localhost")


def test_resolve_np_more_than_slots():
    with pytest.raises(
        ConfigError,
        match=r"^-np 5 is more than the 4 slots given by -H; raise the slot count "
        r"\(e\.g\. -H localhost:5\) or lower -np$",
    ):
        resolve_hosts(5, "localhost:4")


def test_resolve_needs_np_or_hosts():
    with pytest.raises(ConfigError, match=r"give the number of processes: -np N"):
        resolve_hosts(None, None)


@pytest.mark.parametrize("np", [0, -2])
def test_resolve_np_at_least_one(np):
    with pytest.raises(ConfigError, match=rf"^-np must be at least 1, got {np}$"):
        resolve_hosts(np, "localhost:4")


def test_resolve_counts_the_slots_of_remote_hosts_too():
    assert resolve_hosts(None, "localhost:1,remote-node.invalid:3")[0] == 4
    with pytest.raises(ConfigError, match=r"^-np 5 is more than the 4 slots given by -H"):
        resolve_hosts(5, "localhost:1,remote-node.invalid:3")


def test_hostfile_formats(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(
        "# cluster\n\nnode1 slots=4\nnode2 slots=2 max_slots=8   # comment\nnode3:3\nnode4\n  [fe80::1]:2\n10.0.0.5 slots=1\n"
    )
    assert parse_hostfile(str(path)) == [
        HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 3), HostSlots("node4", 1),
        HostSlots("fe80::1", 2), HostSlots("10.0.0.5", 1),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1 slots=0\n", r"line 1 \('node1 slots=0'\): expected 'host slots=N' with N >= 1"),
        ("a slots=1\nnode1 cpus=4\n", r"line 2 \('node1 cpus=4'\): 'cpus=4' is not understood"),
        ("a\na:2\n", r"line 2 \('a:2'\): host 'a' is listed twice"),
        ("# nothing\n\n", r"names no host"),
    ],
)
def test_hostfile_errors_name_the_line(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse_hostfile(str(path))


def test_hostfile_missing_and_both_sources(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read the hostfile"):
        host_list(None, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"either with -H or with --hostfile, not both"):
        host_list("a:1", str(tmp_path / "nope"))


def test_assign_ranks_fills_hosts_in_order_with_cross_ranks():
    slots = assign_ranks(5, [HostSlots("a", 2), HostSlots("b", 1), HostSlots("c", 4), HostSlots("d", 2)])
    assert [(s.rank, s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        (0, "a", 0, 2, 0, 3), (1, "a", 1, 2, 0, 2), (2, "b", 0, 1, 1, 3), (3, "c", 0, 2, 2, 3), (4, "c", 1, 2, 1, 2),
    ]  # d gets no rank; c only the 2 that are left


def test_an_address_of_this_machine_is_local():
    from hora._runtime.bootstrap import local_addr_towards

    addr = local_addr_towards("192.0.2.1")  # the address this machine would send from (nothing is sent)
    if addr.startswith("127."):
        pytest.skip("this machine has no route off the loopback")
    assert is_local_host(addr)
    assert not is_local_host("192.0.2.1")  # TEST-NET-1: never assigned to this machine


def test_resolve_bad_hosts_string():
    with pytest.raises(ConfigError, match="-H entry 'localhost:0'"):
        resolve_hosts(None, "localhost:0")
