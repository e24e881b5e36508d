"""``hora run`` as a Python API: start ranks from a notebook, a script or a test.

>>> import hora.runner
>>> def work():
...     import hora.numpy as hvd
...     hvd.init()
...     return hvd.rank()
>>> hora.runner.run(work, np=2)
[0, 1]
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora._runtime.environment import without_launcher_variables
from hora.errors import ConfigError, HoraError
from hora.runner.allocation import check_not_nested, slurm_allocation
from hora.runner.hosts import HostSlots, is_local_host, parse_hosts
from hora.runner.launch import Failure, LaunchSpec, RunResult, launch

__all__ = ["Failure", "RunError", "RunResult", "run", "run_command"]

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - optional
    _pickler = pickle


class RunError(HoraError):
    """A job started by :func:`run` failed; ``result`` holds the per-rank outcome and the root cause."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def resolve_hosts(np: int | None, hosts: str | Sequence[HostSlots] | None) -> tuple[int, str]:
    """Check ``np`` against ``-H`` and return (np, hostname) for a job on this machine."""
    slots = parse_hosts(hosts) if isinstance(hosts, str) else list(hosts or [])
    if np is None:
        if not slots:
            raise ConfigError("give the number of processes: -np N")
        np = sum(h.slots for h in slots)
    if np < 1:
        raise ConfigError(f"-np must be at least 1, got {np}")
    if slots:
        remote = [h.host for h in slots if not is_local_host(h.host)]
        if remote:
            raise ConfigError(
                f"host {remote[0]!r} is not this machine; this version of hora run starts ranks on "
                "this machine only (use -H localhost:N)"
            )
        total = sum(h.slots for h in slots)
        if np > total:
            raise ConfigError(
                f"-np {np} is more than the {total} slots given by -H; raise the slot count "
                f"(e.g. -H localhost:{np}) or lower -np"
            )
    return np, "localhost"


def run_command(
    command: Sequence[str],
    np: int | None = None,
    hosts: str | None = None,
    env: Mapping[str, str] | None = None,
    output_filename: str | None = None,
    capture: bool = False,
    verbose: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
    rendezvous_port: int = 0,
    **settings: Any,
) -> RunResult:
    """Run ``command`` as ``np`` ranks and return the :class:`RunResult` (it does not raise on failure).

    ``settings`` are hora settings for the workers (``start_timeout=10``, ``transport="tcp"`` ...). With
    ``capture=True`` output is kept in ``result.lines`` instead of printed. ``timeout`` kills the job after that
    many seconds, first dumping every rank's Python stacks to its stderr.

    Without ``hosts``, inside a Slurm allocation the hosts and slots come from it (and ``np`` defaults to its
    slots). Other launchers' per-process variables are not passed on to the workers (see docs/launchers.md).
    """
    outer = os.environ if env is None else env
    check_not_nested(outer)
    allocation = slurm_allocation(outer) if hosts is None else None
    try:
        n, hostname = resolve_hosts(np, allocation.hosts if allocation else hosts)
    except ConfigError as exc:
        if allocation is None:
            raise
        raise ConfigError(
            f"{exc} (hosts from the {allocation.source}; give -H to override, or start the ranks with srun)"
        ) from None
    env = without_launcher_variables(outer)
    spec = LaunchSpec(
        list(command),
        n,
        hostname,
        env,
        settings,
        output_filename,
        capture,
        True,
        verbose,
        timeout=timeout,
        cwd=cwd,
        rendezvous_port=rendezvous_port,
    )
    return launch(spec)


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    np: int | None = None,
    hosts: str | None = None,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
    verbose: bool = False,
    timeout: float | None = None,
    **settings: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``np`` ranks; return the per-rank return values in rank order.

    The function must be picklable (importable by name, or anything cloudpickle handles when it is installed).
    It calls ``hora.numpy.init()`` (or an adapter's) itself, as under ``hora run``.

    Raises:
        RunError: a rank failed or the time limit passed; the message holds the root-cause report.
    """
    workdir = tempfile.mkdtemp(prefix="hora-run-")
    try:
        with open(os.path.join(workdir, "fn.pkl"), "wb") as f:
            _pickler.dump((fn, tuple(args), dict(kwargs or {})), f)
        base = dict(os.environ if env is None else env)
        path = [p for p in sys.path if p]
        if base.get("PYTHONPATH"):
            path.append(base["PYTHONPATH"])
        base["PYTHONPATH"] = os.pathsep.join(path)
        command = [sys.executable, "-m", "hora.runner._worker", workdir]
        result = run_command(command, np, hosts, base, None, capture, verbose, timeout, None, **settings)
        if result.exit_code != 0:
            raise RunError(result.report() or f"the job failed with exit code {result.exit_code}", result)
        out = []
        for rank in range(len(result.returncodes)):
            with open(os.path.join(workdir, f"result.{rank}.pkl"), "rb") as f:
                out.append(pickle.load(f))
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
