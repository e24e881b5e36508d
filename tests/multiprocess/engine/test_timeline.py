"""The timeline writer: Chrome-trace JSON with Horovod's phase names, valid JSON even after SIGKILL."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from hora._engine import timeline as timeline_mod
from hora._engine.timeline import Timeline
from hora.errors import ConfigError
from support import paths

SRC = str(paths.SRC)


def load(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        events = json.load(f)
    assert isinstance(events, list)
    return events


def check_nesting(events: list[dict[str, Any]], complete: bool = True) -> None:
    """Every "E" closes the innermost open "B" of its pid/tid, timestamps never go back within a track."""
    stacks: dict[tuple[int, int], list[str]] = defaultdict(list)
    last_ts: dict[tuple[int, int], float] = {}
    for ev in events:
        if ev["ph"] == "M":
            continue
        key = (ev["pid"], ev["tid"])
        assert ev["ts"] >= last_ts.get(key, 0.0), ev
        last_ts[key] = ev["ts"]
        if ev["ph"] == "B":
            stacks[key].append(ev["name"])
        elif ev["ph"] == "E":
            assert stacks[key], f"E without an open B: {ev}"
            assert stacks[key].pop() == ev["name"], ev
    if complete:
        assert not any(stacks.values()), f"unclosed events: {dict(stacks)}"


def pids_by_name(events: list[dict[str, Any]]) -> dict[str, int]:
    return {ev["args"]["name"]: ev["pid"] for ev in events if ev["name"] == "process_name"}


def track(events: list[dict[str, Any]], pid: int) -> list[tuple[str, str]]:
    return [(ev["ph"], ev["name"]) for ev in events if ev.get("pid") == pid and ev["ph"] != "M"]


@pytest.fixture
def tl(tmp_path):
    t = Timeline(str(tmp_path / "timeline.json"))
    yield t
    t.close()


def test_new_file_is_an_empty_trace(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old content that must go")
    t = Timeline(str(path))
    try:
        assert load(path) == []
        assert t.path == str(path) and t.mark_cycles is False
    finally:
        t.close()
    assert load(path) == []


def test_phases_nesting_and_metadata(tl):
    tl.negotiate_start("grad/w", "allreduce")
    tl.negotiate_rank_ready("grad/w", 0)
    tl.negotiate_rank_ready("grad/w", 1)
    tl.negotiate_end("grad/w")
    tl.start("grad/w", "allreduce", {"dtype": "float32", "shape": "(4, 3)"})
    tl.activity_start("grad/w", "QUEUE")
    tl.activity_end("grad/w")
    tl.activity_start("grad/w", "MEMCPY_IN_FUSION_BUFFER")
    tl.activity_end("grad/w")
    tl.activity_start("grad/w", "SHM_ALLREDUCE")
    tl.activity_end("grad/w")
    tl.end("grad/w", {"bytes": 48})
    tl.start("grad/b", "broadcast")
    tl.end("grad/b")
    tl.close()
    events = load(Path(tl.path))
    check_nesting(events)

    pids = pids_by_name(events)
    assert pids == {"allreduce.grad/w": 1, "broadcast.grad/b": 2}  # Horovod's names: <op>.<name>
    sort = {ev["pid"]: ev["args"]["sort_index"] for ev in events if ev["name"] == "process_sort_index"}
    assert sort == {1: 1, 2: 2}
    assert track(events, 1) == [
        ("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"), ("X", "1"), ("E", "NEGOTIATE_ALLREDUCE"),
        ("B", "ALLREDUCE"),
        ("B", "QUEUE"), ("E", "QUEUE"),
        ("B", "MEMCPY_IN_FUSION_BUFFER"), ("E", "MEMCPY_IN_FUSION_BUFFER"),
        ("B", "SHM_ALLREDUCE"), ("E", "SHM_ALLREDUCE"),
        ("E", "ALLREDUCE"),
    ]  # fmt: skip
    assert track(events, 2) == [("B", "BROADCAST"), ("E", "BROADCAST")]

    w = [ev for ev in events if ev.get("pid") == 1 and ev["ph"] != "M"]
    assert all(ev["tid"] == 0 and isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0 for ev in w)
    assert w[4]["args"] == {"dtype": "float32", "shape": "(4, 3)"}
    assert w[-1]["args"] == {"bytes": 48}
    ticks = [ev for ev in w if ev["ph"] == "X"]
    assert all(ev["dur"] == 0 for ev in ticks)
    assert w[0]["ts"] <= ticks[0]["ts"] <= ticks[1]["ts"] <= w[3]["ts"]


def test_end_closes_an_open_activity(tl):
    tl.start("x", "allreduce")
    tl.activity_start("x", "TCP_ALLREDUCE")
    tl.end("x")
    tl.close()
    events = load(Path(tl.path))
    check_nesting(events)
    assert track(events, 1) == [
        ("B", "ALLREDUCE"),
        ("B", "TCP_ALLREDUCE"),
        ("E", "TCP_ALLREDUCE"),
        ("E", "ALLREDUCE"),
    ]


def test_out_of_order_calls_keep_nesting_valid(tl):
    tl.activity_start("x", "QUEUE")  # nothing open: ignored
    tl.end("x")  # ignored
    tl.activity_end("x")  # ignored
    tl.negotiate_end("x")  # ignored
    tl.negotiate_start("x", "allgather")
    tl.start("x", "allgather")  # ends the negotiation first
    tl.negotiate_end("x")  # not negotiating any more: ignored
    tl.negotiate_start("z", "broadcast")
    tl.negotiate_start("z", "broadcast")  # already negotiating (a second rank's request): ignored
    tl.activity_start("x", "QUEUE")
    tl.activity_start("x", "MEMCPY_OUT_FUSION_BUFFER")  # ends QUEUE first
    tl.start("y", "allreduce")
    tl.start("y", "allreduce")  # restarts: ends the first one
    tl.close()  # x and y left open: a viewer shows them running to the end of the trace
    events = load(Path(tl.path))
    check_nesting(events, complete=False)
    pids = pids_by_name(events)
    assert track(events, pids["allgather.x"]) == [
        ("B", "NEGOTIATE_ALLGATHER"), ("E", "NEGOTIATE_ALLGATHER"),
        ("B", "ALLGATHER"),
        ("B", "QUEUE"), ("E", "QUEUE"),
        ("B", "MEMCPY_OUT_FUSION_BUFFER"),
    ]  # fmt: skip
    assert track(events, pids["allreduce.y"]) == [("B", "ALLREDUCE"), ("E", "ALLREDUCE"), ("B", "ALLREDUCE")]
    assert track(events, pids["broadcast.z"]) == [("B", "NEGOTIATE_BROADCAST")]


def test_activities_context_manager(tl):
    names = ["a", "b", "c"]
    for n in names:
        tl.start(n, "allreduce")
    with tl.activities(names, "MEMCPY_IN_FUSION_BUFFER"):
        pass
    with pytest.raises(RuntimeError), tl.activities(names, "SHM_ALLREDUCE"):
        raise RuntimeError("boom")  # the activities still end
    for n in names:
        tl.end(n)
    tl.close()
    events = load(Path(tl.path))
    check_nesting(events)
    for n, pid in pids_by_name(events).items():
        assert track(events, pid) == [
            ("B", "ALLREDUCE"),
            ("B", "MEMCPY_IN_FUSION_BUFFER"), ("E", "MEMCPY_IN_FUSION_BUFFER"),
            ("B", "SHM_ALLREDUCE"), ("E", "SHM_ALLREDUCE"),
            ("E", "ALLREDUCE"),
        ], n  # fmt: skip


@pytest.mark.parametrize("mark_cycles", [False, True])
def test_mark_cycles(tmp_path, mark_cycles):
    t = Timeline(str(tmp_path / "t.json"), mark_cycles=mark_cycles)
    assert t.mark_cycles is mark_cycles
    t.mark_cycle()
    t.start("x", "allreduce")
    t.mark_cycle()
    t.end("x")
    t.close()
    events = load(tmp_path / "t.json")
    cycles = [ev for ev in events if ev["name"] == "CYCLE_START"]
    if not mark_cycles:
        assert cycles == []
        return
    assert len(cycles) == 2
    assert all(ev["ph"] == "i" and ev["s"] == "g" and "ts" in ev for ev in cycles)
    check_nesting(events)


def test_emitting_after_close_is_a_no_op_and_close_is_idempotent(tmp_path):
    path = tmp_path / "t.json"
    t = Timeline(str(path), mark_cycles=True)
    t.start("x", "allreduce")
    t.end("x")
    t.close()
    before = path.read_bytes()
    t.close()
    t.negotiate_start("x", "allreduce")
    t.negotiate_rank_ready("x", 0)
    t.negotiate_end("x")
    t.start("y", "allreduce", {"a": 1})
    t.activity_start("y", "QUEUE")
    t.activity_end("y")
    t.end("y")
    with t.activities(["y"], "QUEUE"):
        pass
    t.mark_cycle()
    t.flush()
    t.close()
    assert path.read_bytes() == before
    assert t.closed


def test_file_is_valid_after_every_flush(tl):
    path = Path(tl.path)
    for i in range(20):
        tl.start(f"t{i}", "allreduce", {"i": i})
        tl.end(f"t{i}")
        tl.flush()
        events = load(path)
        check_nesting(events)
        assert [ev["args"]["i"] for ev in events if ev["ph"] == "B"] == list(range(i + 1))
    tl.flush()  # nothing pending: no change
    assert len(load(path)) == 20 * 4


def test_writer_thread_flushes_without_being_asked(tl):
    tl.start("x", "allreduce")
    tl.end("x")
    for _ in range(600):  # poll (a loaded machine may delay the thread); no flush() and no close()
        if len(load(Path(tl.path))) == 4:
            break
        time.sleep(timeline_mod.FLUSH_INTERVAL / 2)
    assert [ev["ph"] for ev in load(Path(tl.path)) if ev["ph"] != "M"] == ["B", "E"]


def test_concurrent_emitters(tmp_path):
    path = tmp_path / "t.json"
    t = Timeline(str(path), mark_cycles=True)
    threads_n, iters = 8, 300
    start = threading.Barrier(threads_n + 1)
    stop_flushing = threading.Event()

    def emit(k: int) -> None:
        start.wait()
        for i in range(iters):
            name = f"thread{k}/t{i % 5}"
            t.negotiate_start(name, "allreduce")
            t.negotiate_rank_ready(name, k)
            t.negotiate_end(name)
            t.start(name, "allreduce", {"i": i})
            t.activity_start(name, "QUEUE")
            t.activity_start(name, "SHM_ALLREDUCE")
            t.end(name)
            t.mark_cycle()

    def flusher() -> None:
        start.wait()
        while not stop_flushing.is_set():
            t.flush()
            load(path)  # valid while everyone writes

    workers = [threading.Thread(target=emit, args=(k,)) for k in range(threads_n)]
    f = threading.Thread(target=flusher)
    for th in [*workers, f]:
        th.start()
    for th in workers:
        th.join()
    stop_flushing.set()
    f.join()
    t.close()

    events = load(path)
    check_nesting(events)
    pids = pids_by_name(events)
    assert len(pids) == threads_n * 5
    assert sorted(pids.values()) == list(range(1, threads_n * 5 + 1))
    assert sum(ev["name"] == "CYCLE_START" for ev in events) == threads_n * iters
    per_iter = 1 + 1 + 1 + 1 + 2 + 3  # negotiate B, tick, E, op B, 2 activities B, 3 E
    assert sum(ev["ph"] in "BEX" for ev in events) == threads_n * iters * per_iter


CHILD = textwrap.dedent(
    """
    import sys, time
    from hora._engine.timeline import Timeline

    path, every, pace, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    tl = Timeline(path, mark_cycles=True)
    i = 0
    while not limit or i < limit:
        name = "grad/%d" % (i % 7)
        tl.mark_cycle()
        tl.negotiate_start(name, "allreduce")
        tl.negotiate_rank_ready(name, 0)
        tl.negotiate_rank_ready(name, 1)
        tl.negotiate_end(name)
        tl.start(name, "allreduce", {"i": i, "shape": "(%d,)" % i})
        tl.activity_start(name, "QUEUE")
        tl.activity_start(name, "SHM_ALLREDUCE")
        tl.end(name)
        i += 1
        if i % every == 0:
            tl.flush()
            print(i, flush=True)  # every event up to i is on disk
            if pace:
                time.sleep(pace)
    print("done", flush=True)
    time.sleep(3600)  # until the test kills it
    """
)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=_child_env()
    )


def _reap(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# (flushes before the kill, iterations per flush): batches of 25 iterations are ~3 KiB, of 400 ~50 KiB, so
# kills land inside writes that cross page boundaries (which SIGKILL can cut: see the module docstring)
KILL_POINTS = [(1, 25), (2, 25), (7, 25), (40, 25), (150, 25), (1, 400), (5, 400), (30, 400)]


@pytest.mark.parametrize(("flushes", "every"), KILL_POINTS)
def test_sigkill_leaves_valid_json(tmp_path, flushes, every):
    path = tmp_path / "t.json"
    proc = _spawn(CHILD, str(path), str(every), "0", "0")
    try:
        assert proc.stdout is not None
        flushed = 0
        for _ in range(flushes):
            line = proc.stdout.readline()
            assert line, f"the child exited early with {proc.wait()}"
            flushed = int(line)
        proc.send_signal(signal.SIGKILL)  # while it keeps emitting, flushing, and its writer thread writing
    finally:
        _reap(proc)
    assert proc.returncode == -signal.SIGKILL

    events = load(path)  # json.load succeeds: the file is valid JSON
    check_nesting(events, complete=False)
    ops = [ev["args"]["i"] for ev in events if ev["name"] == "ALLREDUCE" and ev["ph"] == "B"]
    assert ops[:flushed] == list(range(flushed)), "every event flushed before the kill is in the file"
    assert ops == list(range(len(ops)))
    assert sorted(pids_by_name(events)) == sorted(f"allreduce.grad/{k}" for k in range(7))
    assert sum(ev["name"] == "CYCLE_START" for ev in events) >= flushed
    # the helper (path + SWAP_SUFFIX) may be left behind, cut short when the kill landed in a write to it: it is
    # scratch that hora never reads, so nothing is asserted about its content


def test_file_is_complete_whenever_it_is_read(tmp_path):
    """Readers copying the file while a process writes it never see a cut trace (the swap is a rename)."""
    path = tmp_path / "t.json"
    total = 5000
    proc = _spawn(CHILD, str(path), "50", "0.005", str(total))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "50\n"  # the file exists
        seen = 0
        for _ in range(1000):
            events = json.loads(path.read_bytes())  # never cut, whenever it is read
            ops = sum(ev["name"] == "ALLREDUCE" and ev["ph"] == "B" for ev in events)
            assert ops >= seen
            seen = ops
            if seen == total:
                break
        assert seen == total
    finally:
        _reap(proc)


EXIT_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from hora._engine.timeline import Timeline

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # what an application does: SIGTERM -> SystemExit
    tl = Timeline(sys.argv[1])
    for i in range(50):
        tl.start("t", "allreduce", {"i": i})
        tl.end("t")
    tl.start("last", "broadcast")
    tl.end("last")
    if sys.argv[2] == "exit":
        sys.exit(0)  # no flush, no close: the atexit hook writes
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["exit", "sigterm"])
def test_normal_exit_writes_everything(tmp_path, how):
    path = tmp_path / "t.json"
    proc = _spawn(EXIT_CHILD, str(path), how)
    try:
        assert proc.stdout is not None
        if how == "sigterm":
            assert proc.stdout.readline() == "ready\n"
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        _reap(proc)
    events = load(path)
    check_nesting(events)
    assert [ev["args"]["i"] for ev in events if ev["name"] == "ALLREDUCE" and ev["ph"] == "B"] == list(
        range(50)
    )
    assert ("B", "BROADCAST") in [(ev["ph"], ev["name"]) for ev in events]


@pytest.mark.parametrize("kind", ["missing_dir", "directory", "fifo", "device"])
def test_unwritable_path_is_a_config_error(tmp_path, kind):
    if kind == "missing_dir":
        path = str(tmp_path / "no" / "such" / "dir" / "t.json")
    elif kind == "directory":
        path = str(tmp_path)
    elif kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    else:
        path = os.devnull
    with pytest.raises(ConfigError, match="timeline") as info:
        Timeline(path)
    assert path in str(info.value)
    if kind == "device":
        assert Path(os.devnull).is_char_device()


def test_helper_file_lives_while_open(tmp_path):
    path = tmp_path / "t.json"
    helper = Path(str(path) + timeline_mod.SWAP_SUFFIX)
    t = Timeline(str(path))
    assert helper.exists()
    for i in range(5):
        t.start("x", "allreduce", {"i": i})
        t.end("x")
        t.flush()
        assert len(load(path)) == 2 + 2 * (i + 1)
        assert len(load(helper)) == (0 if i == 0 else 2 + 2 * i)  # one batch behind
    t.close()
    assert not helper.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    check_nesting(load(path))


def test_symlinked_path_stays_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    t = Timeline(str(link))
    t.start("x", "allreduce")
    t.end("x")
    t.flush()
    t.close()
    assert link.is_symlink()
    assert len(load(target)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def _no_links(*args: Any, **kwargs: Any) -> None:
    raise PermissionError(errno.EPERM, "hard links not allowed")


def test_without_hard_links_it_appends_in_place(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=timeline_mod.__name__)

    monkeypatch.setattr(timeline_mod.os, "link", _no_links)
    path = tmp_path / "t.json"
    t = Timeline(str(path))
    monkeypatch.undo()
    assert "appending in place" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    inode = path.stat().st_ino
    for i in range(3):
        t.start("x", "allreduce", {"i": i})
        t.end("x")
        t.flush()
        assert len(load(path)) == 2 + 2 * (i + 1)
    t.close()
    assert path.stat().st_ino == inode
    check_nesting(load(path))


def _fail_writes(monkeypatch: pytest.MonkeyPatch, cut_first: bool) -> list[int]:
    """os.pwrite: (optionally a short write of half the data, then) ENOSPC once; real writes afterwards."""
    real_pwrite = os.pwrite
    calls: list[int] = []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls.append(offset)
        if cut_first and len(calls) == 1:
            return real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
        if len(calls) == (2 if cut_first else 1):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)  # cutting back rewrites existing bytes: no new space needed

    monkeypatch.setattr(timeline_mod.os, "pwrite", pwrite)
    return calls


@pytest.mark.parametrize("in_place", [False, True])
def test_failed_write_leaves_valid_json_and_stops_recording(tmp_path, monkeypatch, caplog, in_place):
    caplog.set_level(logging.WARNING, logger=timeline_mod.__name__)
    if in_place:
        monkeypatch.setattr(timeline_mod.os, "link", _no_links)
    path = tmp_path / "t.json"
    t = Timeline(str(path))
    monkeypatch.undo()
    for i in range(2):
        t.start("ok", "allreduce", {"i": i})
        t.end("ok")
        t.flush()
    good = path.read_bytes()
    assert len(json.loads(good)) == 6

    calls = _fail_writes(monkeypatch, cut_first=True)
    t.start("lost", "allreduce")
    t.end("lost")
    t.flush()
    monkeypatch.undo()
    assert len(calls) == (3 if in_place else 2)  # in place, the cut is repaired with one more write
    assert path.read_bytes() == good
    assert "write failed" in caplog.text

    t.start("after", "allreduce")  # dropped: the timeline stopped
    t.end("after")
    t.close()
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_unserialisable_args_are_written_as_strings(tl):
    cycle: list[Any] = []
    cycle.append(cycle)
    tl.start("a", "allreduce", {"dtype": object, "shape": (4, 3)})
    tl.end("a", {"loss": float("nan"), "n": 3})
    tl.start("b", "allreduce", {"cycle": cycle})
    tl.end("b")
    tl.close()
    text = Path(tl.path).read_text()
    assert "NaN" not in text  # json.load would take it, browsers' JSON.parse would not
    events = load(Path(tl.path))
    check_nesting(events)
    args = [ev["args"] for ev in events if "args" in ev and ev["ph"] != "M"]
    assert args == [
        {"dtype": str(object), "shape": [4, 3]},
        {"loss": "nan", "n": 3},
        {"cycle": "[[...]]"},
    ]


def test_helper_is_not_followed_through_a_symlink(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=timeline_mod.__name__)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    path = tmp_path / "t.json"
    Path(str(path) + timeline_mod.SWAP_SUFFIX).symlink_to(victim)
    t = Timeline(str(path))  # falls back to writing in place rather than truncating the link's target
    t.start("x", "allreduce")
    t.end("x")
    t.close()
    assert victim.read_text() == "keep me"
    assert len(load(path)) == 4
    assert "appending in place" in caplog.text


def test_close_from_another_thread_while_emitting(tmp_path):
    path = tmp_path / "t.json"
    t = Timeline(str(path))
    go = threading.Event()

    def emit() -> None:
        i = 0
        while not t.closed:
            t.start("x", "allreduce", {"i": i})
            t.activity_start("x", "QUEUE")
            t.end("x")
            i += 1
            if i == 100:
                go.set()

    th = threading.Thread(target=emit)
    th.start()
    go.wait()
    t.close()
    th.join()
    events = load(path)
    check_nesting(events, complete=False)  # close may land between the emitter's start and end
    assert len(events) >= 2 + 100 * 4


def test_tracks_carry_horovods_tensor_names():
    """horovod/torch/mpi_ops_v2.cc's GetOpName: ``<op>.<name>``, ``<op>.noname.<n>`` unnamed, and a grouped call's
    tensors ``grouped_allreduce.<name>_<i>of<n>``."""
    from hora._engine.messages import Kind, Request
    from hora._engine.timeline import tensor_names, track_label

    assert track_label("test_allreduce", "allreduce") == "allreduce.test_allreduce"
    assert track_label("allreduce.noname.3", "allreduce") == "allreduce.noname.3"
    assert track_label("w", "broadcast") == "broadcast.w"
    named = Request(Kind.ALLREDUCE, "layer.0", "float32", (5,), splits=(2, 3))
    assert tensor_names(named) == ["grouped_allreduce.layer_1of2", "grouped_allreduce.layer_2of2"]
    unnamed = Request(Kind.ALLREDUCE, "grouped_allreduce.noname.0.0", "float32", (5,), splits=(2, 3))
    assert tensor_names(unnamed) == ["grouped_allreduce.noname.0_1of2", "grouped_allreduce.noname.0_2of2"]
    assert [track_label(n, "allreduce") for n in tensor_names(named)] == tensor_names(named)
