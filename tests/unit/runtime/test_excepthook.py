"""Uncaught errors through hora show the script's frames and hora's reason (issue 27, item 2)."""

from __future__ import annotations

import sys

from hora._runtime.excepthook import short_traceback
from hora.config import Config
from hora.errors import ConfigError


def _caught() -> tuple[type[BaseException], BaseException, object]:
    try:
        Config.resolve(env={"HORA_START_TIMEOUT": "soon"})  # raises from inside hora
    except ConfigError:
        return sys.exc_info()  # type: ignore[return-value]
    raise AssertionError("no error")


def test_the_short_form_ends_at_the_scripts_call_into_hora_and_names_the_full_one():
    etype, value, tb = _caught()
    short = short_traceback(etype, value, tb, "/tmp/hora-0/traceback-x.txt")  # type: ignore[arg-type]
    assert short is not None
    lines = short.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "in _caught" in short and "Config.resolve(env=" in short  # the script's frame and line
    assert "/hora/config/" not in short  # none of hora's
    note = next(i for i, line in enumerate(lines) if line.startswith("  ["))
    assert "frame(s) inside hora left out; the full traceback is in /tmp/hora-0/traceback-x.txt]" in lines[note]
    assert lines[note + 1].startswith("hora.errors.ConfigError: ")  # the reason last, where Python puts it


def test_an_error_that_never_passed_through_hora_is_left_to_python():
    try:
        {}["missing"]
    except KeyError:
        etype, value, tb = sys.exc_info()
    assert short_traceback(etype, value, tb, None) is None  # type: ignore[arg-type]


def test_without_a_file_the_note_names_none():
    etype, value, tb = _caught()
    short = short_traceback(etype, value, tb, None)  # type: ignore[arg-type]
    assert short is not None and "frame(s) inside hora left out]" in short and "full traceback" not in short


def test_an_error_raised_in_the_scripts_own_code_under_a_hora_runner_keeps_its_frames():
    """A hora frame further out (hora.runner.function_worker calling the script's function) is not cut: the error
    was raised in the script's own code, and Python's traceback shows it."""
    from hora._runtime import excepthook

    runner: dict = {}
    exec(compile("def call(f):\n    f()\n", excepthook._HORA + "runner_like.py", "exec"), runner)

    def scripts_own():
        raise ValueError("the script's own error")

    try:
        runner["call"](scripts_own)
    except ValueError:
        etype, value, tb = sys.exc_info()
    assert short_traceback(etype, value, tb, None) is None  # type: ignore[arg-type]
