"""Running test functions on real ranks: real processes, real shared memory, real sockets.

``run_ranks(fn, np, ...)`` starts ``np`` processes through :func:`hora.runner.run`, each with a hard time limit; on
time-out every rank's Python stacks are dumped (faulthandler) and the test fails with every rank's stderr, so a
hang becomes a readable failure instead of a stuck CI run.

``Launches`` runs several workers (``support.parts.Part``) in one launch per number of ranks and settings, shared
by the tests of a module: each test still asserts on its own part's results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from hora.errors import RunError
from hora.runner import RunResult, run, run_command
from support.parts import Part, parts_worker

DEFAULT_TIMEOUT = 90.0


def _stderr_dump(result: RunResult) -> str:
    parts = []
    for rank, streams in sorted(result.lines.items()):
        lines = streams.get("stderr", []) + [f"(stdout) {x}" for x in streams.get("stdout", [])[-20:]]
        parts.append(f"--- rank {rank} ---\n" + "\n".join(lines[-80:]))
        if rank in result.stacks:
            parts.append(f"--- rank {rank}: stacks when hora run stopped it ---\n{result.stacks[rank]}")
    return "\n".join(parts)


def run_ranks(fn: Callable[..., Any], np: int, *args: Any, timeout: float = DEFAULT_TIMEOUT, **settings: Any) -> list[Any]:
    """Run ``fn(*args)`` on ``np`` ranks and return the per-rank results; fail the test with all output otherwise."""
    try:
        return run(fn, args, np=np, capture=True, timeout=timeout, **settings)
    except RunError as exc:
        pytest.fail(f"{exc}\n{_stderr_dump(exc.result)}", pytrace=False)


def run_failing(fn: Callable[..., Any], np: int, *args: Any, timeout: float = DEFAULT_TIMEOUT, **settings: Any) -> RunResult:
    """Run ``fn(*args)`` on ``np`` ranks expecting failure; return the :class:`RunResult` for assertions."""
    try:
        run(fn, args, np=np, capture=True, timeout=timeout, **settings)
    except RunError as exc:
        if exc.result.timed_out:
            pytest.fail(f"the job hung until the {timeout:g}s limit:\n{_stderr_dump(exc.result)}", pytrace=False)
        return exc.result
    pytest.fail("the job was expected to fail but every rank succeeded", pytrace=False)


def stderr_of(result: RunResult, rank: int) -> str:
    return "\n".join(result.lines.get(rank, {}).get("stderr", []))


@dataclass(frozen=True)
class Launch:
    """``parts`` run one after another in one launch of ``np`` ranks with ``settings`` (as run_ranks takes them)."""

    np: int
    parts: Sequence[Part]
    settings: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = 240.0  # below the suite's per-test limit (pyproject's timeout), so a hang dumps every rank
    hosts: str = ""  # fake hosts ("a:2,b:2", support/fakehosts.py) instead of hora.runner.run on this host


class Launches:
    """Runs each :class:`Launch` once, when a test first asks for one of its parts (``launches(name)``: the part's
    results in rank order). A launch that failed fails every test that asks for it, with its report, without
    running again. Make one per test module (a module-scoped fixture), so a ``-k`` selection runs only the launches
    its tests need."""

    def __init__(self, *launches: Launch) -> None:
        self._launch_of: dict[str, Launch] = {}
        for launch in launches:
            for part in launch.parts:
                if part.name in self._launch_of:
                    raise ValueError(f"part {part.name!r} is in two launches")
                self._launch_of[part.name] = launch
        self._results: dict[int, dict[str, list[Any]]] = {}
        self._failures: dict[int, str] = {}

    def __call__(self, name: str) -> list[Any]:
        launch = self._launch_of[name]
        key = id(launch)
        if key in self._failures:
            pytest.fail(f"the launch that runs {name!r} failed in an earlier test:\n{self._failures[key]}", pytrace=False)
        if key not in self._results:
            try:
                if launch.hosts:
                    from support.fakehosts import run_on_hosts

                    per_rank = run_on_hosts(parts_worker, launch.hosts, list(launch.parts), timeout=launch.timeout,
                                            **launch.settings)
                else:
                    per_rank = run_ranks(parts_worker, launch.np, list(launch.parts), timeout=launch.timeout,
                                         **launch.settings)
                assert len(per_rank) == launch.np, per_rank
            except pytest.fail.Exception as exc:
                self._failures[key] = str(exc)
                raise
            self._results[key] = {p.name: [r[p.name] for r in per_rank] for p in launch.parts}
        return self._results[key][name]


__all__ = ["Launch", "Launches", "Part", "run_command", "run_failing", "run_ranks", "stderr_of"]
