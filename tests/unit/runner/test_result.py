"""The root cause hora run reports: the rank that failed for a reason of its own, or — after a stall — the rank the
others waited for; never a rank that only reacted to another."""

from __future__ import annotations

from hora.runner.result import Failure, RunResult, root_cause

STALL = (
    "hora.errors.StallError: stalled: 1 collective(s) waited more than 2s (HORA_STALL_SHUTDOWN_TIME_SECONDS): "
    "rank 2 never submitted 'grad'. Every rank must submit the same collectives; check for a rank that skips a step "
    "or names a tensor differently."
)


def test_after_a_stall_the_rank_the_others_waited_for_is_the_root_cause():
    failures = [
        Failure(0, "h", 10, 1, ["Traceback (most recent call last):", STALL], when=1.0),
        Failure(1, "h", 11, 1, ["Traceback (most recent call last):", STALL], when=1.1),
        Failure(2, "h", 12, -15, [], when=1.7, stopped=True),  # asleep; stopped by hora run
    ]
    rc = root_cause(failures)
    assert rc is not None and rc.rank == 2
    assert "waited for it in a collective it never submitted" in rc.reason and "'grad'" in rc.reason
    report = RunResult(1, [1, 1, -15], rc, failures).report()
    assert "the other ranks waited for rank 2 until the stall shutdown" in report
    rows = [line.split() for line in report.splitlines() if line.startswith("     ")]
    assert [r[0] for r in rows if "<-" in r] == ["2"]  # the table marks rank 2 only


def test_a_rank_that_reacted_to_a_lost_peer_is_not_the_root_cause():
    failures = [
        Failure(0, "h", 10, 1, ["hora.errors.PeerLostError: rank 1 closed its connection"], when=1.0),
        Failure(1, "h", 11, 1, ["ValueError: bad batch"], when=1.2),
    ]
    assert root_cause(failures).rank == 1


def test_the_report_shows_the_users_frame_when_hora_frames_fill_the_tail():
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/me/train.py", line 42, in <module>',
        "    loss = step(batch)",
    ] + [f'  File "/x/site-packages/hora/_frontend/core.py", line {i}, in f\n    g()' for i in range(12)] + [
        "hora.errors.MismatchError: shapes differ",
    ]
    f = Failure(0, "h", 10, 1, tail, when=1.0)
    report = RunResult(1, [1], f, [f]).report()
    assert '/home/me/train.py", line 42' in report and "loss = step(batch)" in report
