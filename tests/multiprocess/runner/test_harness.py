"""The multi-process harness turns a hang into a readable failure: every rank's stack, then a kill."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from hora.errors import RunError
from hora.runner import run
from workers.failures import hang_worker, marker_then_sleep_worker


def test_a_hang_ends_with_every_ranks_stack():
    with pytest.raises(RunError) as info:
        run(hang_worker, np=2, capture=True, timeout=5)
    result = info.value.result
    assert result.timed_out and result.exit_code == 124
    assert "exceeded its time limit" in str(info.value)
    for rank, where in ((0, "synchronize"), (1, "hang_worker")):
        dump = result.stacks[rank]  # faulthandler's dump, taken before the ranks were killed
        assert "Current thread" in dump or "Thread 0x" in dump, dump
        assert where in dump, dump
    assert "where the ranks still running were" in result.report()


def test_ctrl_c_stops_the_ranks_then_reaches_the_caller(tmp_path):
    """hora.runner.run catches SIGINT to stop the ranks; afterwards the caller's own handler gets the signal (the
    default one raises KeyboardInterrupt), so a script (or pytest) that runs a job can still be interrupted. The
    caller's handler is set here: a pytest started in the background by a non-interactive shell inherits SIGINT
    ignored, and hora leaves an ignored signal ignored (tests/unit/runner/test_signals.py)."""
    calls: list[int] = []

    def callers_handler(signum: int, frame: object) -> None:
        calls.append(signum)
        raise KeyboardInterrupt

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, callers_handler)
    try:
        thread = threading.Thread(target=interrupt_once_started, daemon=True)
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            run(marker_then_sleep_worker, args=(str(tmp_path),), np=2, capture=True, timeout=120)
        thread.join(5)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [signal.SIGINT]  # once: hora's own handler took the first delivery
    assert len(list(tmp_path.glob("started.*"))) == 2
