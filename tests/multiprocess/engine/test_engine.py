"""The engine on real ranks: tensor fusion, the response cache, join, the stall inspector and the timeline.

The tests of fusion, the cache and join share one launch per number of ranks (``launches``): each worker runs
on a fresh group with its own settings (support/parts.py), and each test asserts on its worker's results.
"""

from __future__ import annotations

import json
import re

import pytest

from support.harness import Launch, Launches, run_ranks
from support.parts import Part
from workers.engine import (
    barrier_worker,
    cached_join_worker,
    changing_shape_worker,
    disagreeing_settings_worker,
    random_fusion_worker,
    repeated_small_worker,
    scaled_fusion_worker,
    stall_timing_worker,
    stall_warning_worker,
    stall_worker,
    timeline_worker,
)

ENGINES = {
    "default": {},
    "no-fusion": {"fusion_threshold": 0},
    "no-cache": {"cache_capacity": 0},
    "tiny": {"fusion_threshold": 4096, "cache_capacity": 3},  # many groups, constant eviction
}


RANDOM = [(2, "shm"), (3, "shm"), (3, "tcp")]
REPEATED = [(2, "shm"), (3, "shm"), (4, "shm"), (3, "tcp")]
JOIN_ENGINES = ["default", "no-cache", "tiny"]
SHAPE_ENGINES = ["default", "tiny"]


def _parts(np_: int) -> list[Part]:
    """Every test of fusion, the cache and join on ``np_`` ranks, each with its settings (support/parts.py)."""
    parts = [Part(f"random {engine} {transport}", random_fusion_worker, (6, 12, 11),
                  {"transport": transport, **ENGINES[engine]})
             for n, transport in RANDOM if n == np_ for engine in ENGINES]
    parts += [Part(f"repeated {transport}", repeated_small_worker, (6,), {"transport": transport})
              for n, transport in REPEATED if n == np_]
    if np_ == 3:
        parts.append(Part("repeated no-cache", repeated_small_worker, (4,), {"cache_capacity": 0}))
        parts += [Part(f"scaled {t}", scaled_fusion_worker, (), {"transport": t}) for t in ("shm", "tcp")]
        parts += [Part(f"join {e}", cached_join_worker, (5,), ENGINES[e]) for e in JOIN_ENGINES]
        parts += [Part(f"shapes {e}", changing_shape_worker, (), ENGINES[e]) for e in SHAPE_ENGINES]
    return [Part(f"np{np_} {p.name}", p.fn, p.args, p.settings) for p in parts]


@pytest.fixture(scope="module")
def launches() -> Launches:
    """One launch per number of ranks for the tests of fusion, the cache and join (the stall and timeline tests
    below keep launches of their own)."""
    return Launches(*(Launch(n, _parts(n)) for n in (2, 3, 4)))


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize(("np_", "transport"), RANDOM)
def test_random_tensor_sets_in_random_orders(launches, engine, np_, transport):
    results = launches(f"np{np_} random {engine} {transport}")
    assert results == [72] * np_


@pytest.mark.parametrize(("np_", "transport"), REPEATED)
def test_repeated_small_allreduces_every_op_and_dtype(launches, np_, transport):
    assert launches(f"np{np_} repeated {transport}") == [54] * np_


def test_repeated_small_allreduces_without_cache(launches):
    assert launches("np3 repeated no-cache") == [36] * 3


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_fused_average_and_scale_factors(launches, transport):
    results = launches(f"np3 scaled {transport}")
    assert results == [[2.0, 6.0, 2.0]] * 3


@pytest.mark.parametrize("engine", JOIN_ENGINES)
def test_join_with_cached_tensors(launches, engine):
    results = launches(f"np3 join {engine}")
    assert results == [[3.0, 3.0, 3.0, 2.0, 1.0], [3.0, 3.0, 3.0, 2.0], [3.0, 3.0, 3.0]]


@pytest.mark.parametrize("engine", SHAPE_ENGINES)
def test_changing_shapes_renegotiate(launches, engine):
    results = launches(f"np3 shapes {engine}")
    assert results == [[(3,), (3,), (5,), (5,), (1,), (0,), (3,)]] * 3


@pytest.mark.parametrize("cached", [False, True])
def test_stall_shutdown_fails_every_rank_and_names_the_missing_rank(cached):
    results = run_ranks(
        stall_worker, 3, cached, 6.0, stall_check_time=1.0, stall_shutdown_time=2.0, timeout=60
    )
    for r in results:
        assert r.startswith("StallError: stalled: 1 collective(s) waited more than 2s"), r
        assert "rank 1 never submitted 'late.grad'" in r, r


def test_stall_warning_lists_missing_ranks_and_the_shutdown_then_the_job_completes_and_waiting_ranks_sleep():
    results = run_ranks(stall_warning_worker, 2, 6.0, stall_check_time=1.0, timeout=60)
    for out, _, _ in results:
        assert out == [2.0, 2.0, 2.0]
    warnings = [w for w in results[0][1] if "Stalled collectives" in w]
    assert warnings, results[0][1]
    report = warnings[0]
    assert "waited more than 1s for other ranks" in report
    assert re.search(r"Missing ranks:\n1: \[slow\.tensor\]  \(rank 1 \(host \S+, pid \d+\)\)\n", report), report
    # the default shutdown (finite) and the setting that changes it are named
    assert re.search(r"shut down with a StallError if they still wait \d+s from now \(1800s in all, "
                     r"--stall-check-shutdown-time-seconds \(HORA_STALL_SHUTDOWN_TIME_SECONDS\); 0 never\)", report)
    assert results[1][1] == []  # only the coordinator reports
    # rank 0 waited 6 s for rank 1: after the first second it sleeps between cycles instead of spinning (measured
    # here: 0.37 CPU seconds per second spinning, 0.1 with the pauses)
    assert results[0][2] < 0.2, results[0][2]


@pytest.mark.parametrize("cached", [False, True])
def test_the_stall_warning_comes_at_the_check_time_counted_from_the_first_submission(cached):
    """A cached tensor first waits in the response cache (half the check time) before it reaches the coordinator:
    the warning must still come at the check time after rank 0 submitted it, not one and a half check times."""
    check = 4.0
    results = run_ranks(stall_timing_worker, 2, cached, 3 * check, stall_check_time=check, timeout=90)
    submitted, warned = results[0]
    assert warned is not None, "no stall warning on rank 0"
    assert check <= warned - submitted < 1.4 * check, (submitted, warned)


def test_no_stall_check_means_no_report():
    results = run_ranks(stall_warning_worker, 2, 2.5, stall_check_time=1.0, stall_check_disable=True, timeout=60)
    assert all("Stalled" not in w for _, ws, _ in results for w in ws)


def _events(path):
    with open(path) as f:
        return json.load(f)  # valid JSON: the file is complete after stop/shutdown


@pytest.mark.parametrize("runtime", [False, True])
def test_timeline_records_negotiation_fusion_and_transport(tmp_path, runtime):
    path = tmp_path / "timeline.json"
    settings = {} if runtime else {"timeline": str(path)}
    assert run_ranks(timeline_worker, 2, str(path), runtime, **settings) == [0, 1]
    events = _events(path)
    names = {e["name"] for e in events}
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    # Horovod's names (GetOpName): <op>.<name>, and <base>_<i>of<n> for the tensors of a grouped allreduce
    expected = {"grouped_allreduce.layer_1of4", "grouped_allreduce.layer_4of4", "broadcast.bcast", "allgather.gather0"}
    assert expected <= tracks
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "NEGOTIATE_BROADCAST", "BROADCAST", "ALLGATHER"} <= names
    assert "SHM_ALLREDUCE" in names and "SHM_BROADCAST" in names
    assert {"0", "1"} <= names  # a tick per rank as it becomes ready during negotiation
    if runtime:
        assert "CYCLE_START" in names
        assert "allreduce.after.stop" not in tracks
    else:
        assert "CYCLE_START" not in names
    # every begin has its end, per track
    depth: dict = {}
    for e in events:
        if e.get("ph") == "B":
            depth[e["pid"]] = depth.get(e["pid"], 0) + 1
        elif e.get("ph") == "E":
            depth[e["pid"]] -= 1
            assert depth[e["pid"]] >= 0
    assert all(v == 0 for v in depth.values())


def test_timeline_shows_fusion_buffer_copies_over_tcp(tmp_path):
    path = tmp_path / "timeline.json"
    run_ranks(timeline_worker, 2, str(path), False, timeline=str(path), transport="tcp")
    names = {e["name"] for e in _events(path)}
    assert {"MEMCPY_IN_FUSION_BUFFER", "TCP_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"} <= names


@pytest.mark.parametrize(
    ("setting", "label", "names"),
    [
        ("fusion_threshold", "fusion threshold", "HORA_FUSION_THRESHOLD"),
        ("cache_capacity", "cache capacity", "HORA_CACHE_CAPACITY"),
    ],
)
def test_ranks_must_agree_on_fusion_and_cache(setting, label, names):
    results = run_ranks(disagreeing_settings_worker, 3, setting)
    expect = f"the ranks disagree on the {label}: 1024 on ranks 0, 2 but 2048 on rank 1; set {names}"
    assert all(r.startswith(expect) for r in results), results


@pytest.mark.parametrize(("np_", "transport"), [(2, "shm"), (3, "shm"), (3, "tcp")])
def test_repeated_barriers_hold_every_rank_until_the_last_arrives(np_, transport):
    assert run_ranks(barrier_worker, np_, 4, transport=transport) == [[]] * np_
