"""The bound on processes per machine (issue 27, items 4 and 5) and the descriptors they need."""

from __future__ import annotations

import resource
import sys

import pytest

from hora.cli import main
from hora.errors import ConfigError
from hora.runner import limits


def test_more_than_16_processes_per_cpu_are_refused_unless_oversubscribed():
    assert limits.process_count_problem(32, "-np 32", False, cpus=2) is None
    problem = limits.process_count_problem(33, "-np 33", False, cpus=2)
    assert problem is not None and problem.startswith("-np 33 would start 33 processes on this machine, which has 2")
    assert "--oversubscribe (HORA_OVERSUBSCRIBE=1)" in problem
    assert limits.process_count_problem(100_000, "-np 100000", True, cpus=2) is None


def test_the_soft_descriptor_limit_is_raised_for_many_processes_or_the_fix_is_named(monkeypatch):
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, lim: calls.append(lim))
    limits.check_process_count(1000, "-np 1000", True)
    assert calls == [(64 + 3 * 1000, 4096)]
    with pytest.raises(ConfigError, match=r"needs about 6064 open files .*\(ulimit -n 6064\)"):
        limits.check_process_count(2000, "-np 2000", True)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-np", "100000"], "-np 100000 would start 100000 processes"),
        (["-np", "2", "--num-ps", "100000"], "-np 2 with 100000 parameter server(s) would start 100002 processes"),
    ],
)
def test_hora_run_refuses_absurd_counts_before_starting_anything(args, says, capsys, monkeypatch):
    monkeypatch.delenv("HORA_OVERSUBSCRIBE", raising=False)
    assert main(["run", *args, sys.executable, "-c", "pass"]) == 2
    assert says in capsys.readouterr().err
