"""hora run's signal handling keeps what the process ignores: a background command of a non-interactive shell
starts with SIGINT ignored, and a Ctrl-C meant for the foreground must not stop its job (Python keeps SIG_IGN too)."""

from __future__ import annotations

import signal

from hora._proc import handle_signals


def _mine(signum: int, frame: object) -> None:
    raise AssertionError("not called")


def test_an_ignored_signal_stays_ignored_and_the_others_are_handled_then_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with handle_signals(_mine, signal.SIGINT, signal.SIGTERM) as installed:
            assert installed
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is _mine
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_a_handled_signal_gets_the_handler_and_back_its_own():
    before = signal.getsignal(signal.SIGINT)
    with handle_signals(_mine, signal.SIGINT):
        assert signal.getsignal(signal.SIGINT) is _mine
    assert signal.getsignal(signal.SIGINT) is before
