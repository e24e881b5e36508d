"""The dashboard's log reader: the tail first, then only what was appended, filtered by source and rank."""

from __future__ import annotations

from hora.dashboard import logs
from hora.dashboard.logs import LogFollower, log_sources


def _line(second: int, rank: int, text: str) -> str:
    return f"2026-01-01T00:00:{second:02d}.000Z [algo-1 rank {rank}]<stdout> {text}\n"


def test_tail_then_new_lines_once_each_and_a_partial_line_waits(tmp_path):
    sources = log_sources(tmp_path, ["algo-1", "algo-2"])
    (tmp_path / "logs").mkdir()
    sources["job"].write_text("2026-01-01T00:00:00Z InProgress / Training\n")
    sources["algo-1"].write_text("".join(_line(s, s % 2, f"line {s}") for s in range(1, 6)))
    follower = LogFollower(sources)
    tail = follower.tail(3)
    assert [t.split()[-1] for t in tail] == ["3", "4", "5"]
    assert follower.new() == []
    with open(sources["algo-1"], "a") as f:
        f.write(_line(7, 1, "seven") + "2026-01-01T00:00:08.000Z [algo-1 rank 0]<stdout> unfin")
    with open(sources["algo-2"], "w") as f:  # a log that appears later
        f.write("2026-01-01T00:00:06.000Z [algo-2 rank 2]<stderr> six\n")
    assert [t.split()[-1] for t in follower.new()] == ["six", "seven"]
    with open(sources["algo-1"], "a") as f:
        f.write("ished\n")
    assert [t.split()[-1] for t in follower.new()] == ["unfinished"]


def test_source_and_rank_filters(tmp_path):
    sources = log_sources(tmp_path, ["algo-1"])
    (tmp_path / "logs").mkdir()
    sources["job"].write_text("2026-01-01T00:00:00Z Starting\n")
    sources["algo-1"].write_text(_line(1, 0, "zero") + _line(2, 1, "one") + _line(3, 10, "ten"))
    assert [t.split()[-1] for t in LogFollower(sources, rank=1).tail(10)] == ["one"]
    assert [t.split()[-1] for t in LogFollower(sources, host="job").tail(10)] == ["Starting"]
    assert len(LogFollower(sources, host="algo-1").tail(10)) == 3


def test_the_first_view_of_a_large_log_reads_its_end_only(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "TAIL_BYTES", 1000)
    sources = log_sources(tmp_path, ["algo-1"])
    (tmp_path / "logs").mkdir()
    sources["algo-1"].write_text("".join(_line(s // 4, 0, f"n{s}") for s in range(200)))
    tail = LogFollower(sources, host="algo-1").tail(100)
    assert 0 < len(tail) < 1000 // 40 and tail[-1].endswith("n199")
    assert all(t.startswith("2026-") for t in tail)  # the cut first line was dropped
