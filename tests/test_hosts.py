"""Parsing -H host:slots and checking it against -np."""

from __future__ import annotations

import socket

import pytest

from hora.errors import ConfigError
from hora.runner import resolve_hosts
from hora.runner.hosts import HostSlots, is_local_host, parse_hosts


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


def test_resolve_remote_host():
    with pytest.raises(
        ConfigError, match=r"^host 'remote-node\.invalid' is not this machine; .*\(use -H localhost:N\)$"
    ):
        resolve_hosts(2, "localhost:1,remote-node.invalid:1")


def test_resolve_bad_hosts_string():
    with pytest.raises(ConfigError, match="-H entry 'localhost:0'"):
        resolve_hosts(None, "localhost:0")
