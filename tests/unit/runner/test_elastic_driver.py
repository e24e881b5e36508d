"""The elastic launcher's logic without processes: discovery output, host order and blacklist cooldowns (Horovod's
rules), slot assignment, and the decisions taken once every member of a round has reported."""

from __future__ import annotations

import json

import pytest

from hora._runtime.elastic_join import HostUpdateResult
from hora._runtime.rendezvous import RendezvousServer
from hora.errors import ConfigError
from hora.runner.elastic.discovery import (
    DiscoveryError,
    FixedHosts,
    HostDiscoveryScript,
    HostManager,
    HostState,
    parse_discovery_output,
)
from hora.runner.elastic.driver import (
    FAILURE,
    READY,
    RESET_LIMIT_EXCEEDED_MESSAGE,
    SUCCESS,
    ElasticDriver,
    ElasticJobError,
    slot_assignments,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_discovery_lines_give_hosts_and_slots():
    assert parse_discovery_output("a:4\n\nb\n  c:2 \n", 3) == {"a": 4, "b": 3, "c": 2}
    assert parse_discovery_output("", 1) == {}  # no host ready yet
    with pytest.raises(DiscoveryError, match="'a:x'"):
        parse_discovery_output("a:x\n", 1)


def test_a_discovery_script_runs_in_the_shell_and_its_failure_names_it(tmp_path):
    assert HostDiscoveryScript("printf 'h1:2\\nh2\\n'", 4).find_available_hosts_and_slots() == {"h1": 2, "h2": 4}
    with pytest.raises(DiscoveryError, match=r"'echo no >&2; exit 3' failed with exit code 3: no"):
        HostDiscoveryScript("echo no >&2; exit 3", 1).find_available_hosts_and_slots()
    with pytest.raises(DiscoveryError, match=r"did not finish within 0\.2s"):
        HostDiscoveryScript("sleep 5", 1, timeout=0.2).find_available_hosts_and_slots()


def test_hosts_keep_their_order_and_new_ones_come_after():
    found = FixedHosts({"b": 1, "a": 2})
    hosts = HostManager(found)
    assert hosts.update_available_hosts() == HostUpdateResult.added
    assert hosts.current_hosts.order == ("a", "b")
    found.host_slots = {"c": 1, "b": 1, "a": 2}
    assert hosts.update_available_hosts() == HostUpdateResult.added
    assert hosts.current_hosts.order == ("a", "b", "c")
    found.host_slots = {"c": 1, "b": 2}
    assert hosts.update_available_hosts() == HostUpdateResult.mixed
    assert hosts.current_hosts.order == ("b", "c")
    assert hosts.update_available_hosts() == HostUpdateResult.no_update


def test_without_a_cooldown_range_a_blacklisted_host_stays_out():
    clock = Clock()
    hosts = HostManager(FixedHosts({"a": 1, "b": 1}), clock=clock)
    hosts.update_available_hosts()
    hosts.blacklist("b")
    clock.now += 10_000
    assert hosts.update_available_hosts() == HostUpdateResult.no_update
    assert hosts.current_hosts.order == ("a",)


def test_a_blacklisted_host_returns_after_a_cooldown_that_doubles_up_to_the_maximum(monkeypatch):
    monkeypatch.setattr("random.uniform", lambda a, b: 0.0)
    clock = Clock()
    hosts = HostManager(FixedHosts({"a": 1, "b": 1}), cooldown_range=(10, 30), clock=clock)
    hosts.update_available_hosts()
    hosts.blacklist("b")  # first failure: 10 * 2**1 = 20 s
    assert hosts.state("b").cooldown_end == 1020.0
    clock.now = 1019.0
    assert hosts.update_available_hosts() == HostUpdateResult.no_update
    assert hosts.current_hosts.order == ("a",)
    clock.now = 1020.0
    assert hosts.update_available_hosts() == HostUpdateResult.added  # back, as an added host
    assert hosts.current_hosts.order == ("a", "b") and not hosts.is_blacklisted("b")
    hosts.blacklist("b")  # second failure: 10 * 2**2 = 40 s, capped at 30
    assert hosts.state("b").cooldown_end == 1050.0


def test_cooldown_ranges_outside_horovods_bounds_are_refused():
    for bad in [(0, 10), (10, 3601), (20, 10)]:
        with pytest.raises(ConfigError, match="--blacklist-cooldown-range"):
            HostManager(FixedHosts({}), cooldown_range=bad)
    state = HostState((1, 2))
    assert not state.is_blacklisted() and not state.is_resurrected()


def test_slots_fill_hosts_in_order_up_to_max_np():
    hosts = HostManager(FixedHosts({"a": 2, "b": 2, "c": 1}))
    hosts.update_available_hosts()
    slots = slot_assignments(hosts.current_hosts, max_np=4)
    assert [(s.rank, s.host, s.local_rank, s.cross_rank, s.cross_size) for s in slots] == [
        (0, "a", 0, 0, 2),
        (1, "a", 1, 0, 2),
        (2, "b", 0, 1, 2),
        (3, "b", 1, 1, 2),
    ]
    assert len(slot_assignments(hosts.current_hosts, max_np=None)) == 5


def _driver(hosts: dict[str, int], reset_limit: int | None = None) -> tuple[ElasticDriver, RendezvousServer]:
    store = RendezvousServer(b"s" * 32)  # never started: the driver uses it in-process
    manager = HostManager(FixedHosts(hosts))
    driver = ElasticDriver(manager, store, "job/elastic/", 1, None, reset_limit, lambda m: None)
    driver.discover()
    return driver, store


def test_a_round_is_published_with_every_members_place_and_the_left_out_marked_removed():
    driver, store = _driver({"a": 1, "b": 1, "c": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.publish([])
    driver.hosts.blacklist("b")
    _, left_out = driver.form_round(driver.hosts.current_hosts)
    driver.publish(left_out)
    data = store.snapshot("job/elastic/")
    assert data["job/elastic/round"] == "2" and left_out == ["b:0"]
    assert json.loads(data["job/elastic/r2/c:0"])["rank"] == 1 and json.loads(data["job/elastic/r2/c:0"])["size"] == 2
    assert json.loads(data["job/elastic/r2/b:0"]) == {"removed": True}


def test_the_round_is_decided_only_when_every_member_reported():
    driver, store = _driver({"a": 1, "b": 1, "c": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.publish([])
    assert driver.record("c:0", FAILURE)
    assert not driver.record("z:0", FAILURE)  # not a member
    assert driver.decide() is None
    store.put({"job/elastic/ready/a:0": "1", "job/elastic/ready/b:0": "0"})  # b's mark is from an older round
    for sid in driver.ready_slots():
        driver.record(sid, READY)
    assert driver.decide() is None
    driver.record("b:0", READY)
    decision = driver.decide()
    assert decision is not None and decision.action == "next" and decision.blacklisted == ("c",)
    assert driver.hosts.is_blacklisted("c") and not driver.record("c:0", SUCCESS)  # its exits no longer count


def test_decisions_follow_horovods_registry():
    driver, _ = _driver({"a": 1, "b": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.record("a:0", SUCCESS)
    driver.record("b:0", READY)
    assert driver.decide().action == "done"  # any success ends the job

    driver, _ = _driver({"a": 1, "b": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.record("a:0", FAILURE)
    driver.record("b:0", FAILURE)
    assert driver.decide().message == "every worker of the last round (2) failed"

    driver, _ = _driver({"a": 2, "b": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.record("a:0", FAILURE)
    driver.record("a:1", READY)
    driver.record("b:0", READY)
    assert driver.decide().action == "next" and driver.resets == 1  # a's other worker goes with its host


def test_the_reset_limit_counts_resets_not_the_first_round():
    driver, _ = _driver({"a": 1, "b": 1, "c": 1}, reset_limit=1)
    driver.form_round(driver.hosts.current_hosts)
    for sid in ("a:0", "b:0", "c:0"):
        driver.record(sid, READY)
    assert driver.decide().action == "next"
    driver.form_round(driver.hosts.current_hosts)
    for sid in ("a:0", "b:0", "c:0"):
        driver.record(sid, READY)
    decision = driver.decide()
    assert decision.action == "fail" and decision.message == RESET_LIMIT_EXCEEDED_MESSAGE.format(1)


def test_a_round_without_any_host_of_the_last_one_is_refused():
    driver, _ = _driver({"a": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.hosts._discovery.host_slots = {"z": 1}  # type: ignore[attr-defined]
    driver.discover()
    with pytest.raises(ElasticJobError, match="no hosts from the previous set remain"):
        driver.form_round(driver.hosts.current_hosts)


def test_a_host_change_that_moves_ranks_is_noticed_once():
    driver, store = _driver({"a": 1})
    driver.form_round(driver.hosts.current_hosts)
    driver.hosts._discovery.host_slots = {"a": 1, "b": 1}  # type: ignore[attr-defined]
    assert driver.discover() == HostUpdateResult.added
    assert store.snapshot("job/elastic/notice")["job/elastic/notices"] == "1"
    assert json.loads(store.snapshot("job/elastic/notice/1")["job/elastic/notice/1"]) == {"update": 2}
    assert driver.discover() == HostUpdateResult.no_update
    assert store.snapshot("job/elastic/notices")["job/elastic/notices"] == "1"


def test_the_elastic_flags_make_a_job_elastic_and_bad_counts_are_refused():
    import argparse

    from hora.runner.elastic.launch import ElasticSpec, _counts
    from hora.runner.flags import add_run_arguments, elastic_options

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert elastic_options(parser.parse_args(["-np", "2", "python"])) == {}
    args = parser.parse_args(["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "1", "5", "python"])
    assert elastic_options(args) == {"min_np": 1, "slots_per_host": 1, "blacklist_cooldown_range": (1, 5)}
    assert _counts(ElasticSpec(["x"], np=None, min_np=2)) == (2, 2, None)
    for spec, message in [
        (ElasticSpec(["x"]), "-np N"),
        (ElasticSpec(["x"], np=1, min_np=2), "less than --min-np"),
        (ElasticSpec(["x"], np=4, max_np=3), "--max-np 3 is less"),
        (ElasticSpec(["x"], np=2, reset_limit=-1), "--reset-limit"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _counts(spec)
