"""Running test functions on real ranks: real processes, real shared memory, real sockets.

``run_ranks(fn, np, ...)`` starts ``np`` processes through :func:`hora.runner.run`, each with a hard time limit; on
time-out every rank's Python stacks are dumped (faulthandler) and the test fails with every rank's stderr, so a
hang becomes a readable failure instead of a stuck CI run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hora.errors import RunError
from hora.runner import RunResult, run, run_command

DEFAULT_TIMEOUT = 90.0


def _stderr_dump(result: RunResult) -> str:
    parts = []
    for rank, streams in sorted(result.lines.items()):
        lines = streams.get("stderr", []) + [f"(stdout) {x}" for x in streams.get("stdout", [])[-20:]]
        parts.append(f"--- rank {rank} ---\n" + "\n".join(lines[-80:]))
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


__all__ = ["run_command", "run_failing", "run_ranks", "stderr_of"]
