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
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora.config import Config
from hora.config.launchers import without_launcher_variables
from hora.config.variables import environment
from hora.errors import ConfigError, RunError
from hora.runner.allocation import check_not_nested, slurm_allocation
from hora.runner.hosts import HostSlots, parse_hostfile, parse_hosts
from hora.runner.launch import LaunchSpec, launch
from hora.runner.observer import RunObserver
from hora.runner.result import Failure, RunResult
from hora.runner.ssh import SshOptions

__all__ = ["Failure", "RunError", "RunResult", "run", "run_command"]

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - optional
    _pickler = pickle


def host_list(hosts: str | Sequence[HostSlots] | None, hostfile: str | None = None) -> list[HostSlots]:
    """The hosts of ``-H`` or ``--hostfile`` (not both); empty when neither is given."""
    if hosts and hostfile:
        raise ConfigError("give the hosts either with -H or with --hostfile, not both")
    if hostfile:
        return parse_hostfile(hostfile)
    return parse_hosts(hosts) if isinstance(hosts, str) else list(hosts or [])


def resolve_hosts(np: int | None, hosts: str | Sequence[HostSlots] | None) -> tuple[int, str]:
    """Check ``np`` against the slots of ``-H`` and return (np, the host name of a single-host job)."""
    slots = host_list(hosts)
    if np is None:
        if not slots:
            raise ConfigError("give the number of processes: -np N")
        np = sum(h.slots for h in slots)
    if np < 1:
        raise ConfigError(f"-np must be at least 1, got {np}")
    if slots:
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
    hostfile: str | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    ssh_options: Sequence[str] = (),
    network_interface: str | None = None,
    elastic: Mapping[str, Any] | None = None,
    observer: RunObserver | None = None,
    **settings: Any,
) -> RunResult:
    """Run ``command`` as ``np`` ranks and return the :class:`RunResult` (it does not raise on failure).

    ``settings`` are hora settings for the workers (``start_timeout=10``, ``transport="tcp"`` ...). With
    ``capture=True`` output is kept in ``result.lines`` instead of printed. ``timeout`` kills the job after that
    many seconds, first taking every rank's Python stacks (``result.stacks``; the report says where each was).

    ``hosts`` (``"h1:4,h2:4"``) or ``hostfile`` place the ranks; hosts that are not this machine are reached over
    SSH (``ssh_port``, ``ssh_identity_file``, extra ``ssh_options`` as ``-o`` values), checked first, and given
    ``start_timeout`` seconds to answer. See docs/multihost.md. Without either, inside a Slurm allocation the hosts
    and slots come from it (and ``np`` defaults to its slots). Other launchers' per-process variables are not
    passed on to the workers (see docs/launchers.md).

    ``elastic`` (``min_np``, ``max_np``, ``host_discovery_script``, ``slots_per_host``, ``reset_limit``,
    ``blacklist_cooldown_range``: ``hora run``'s elastic options) makes it an elastic job (docs/elastic.md).
    ``observer`` (:class:`~hora.runner.observer.RunObserver`) is told of the ranks, every line and the end
    (``hora run --record``; not for elastic jobs yet).

    Raises:
        HostError: a remote host cannot be used (unreachable, refusing SSH, rejecting the key, not answering).
    """
    outer = environment() if env is None else env
    check_not_nested(outer)
    allocation = slurm_allocation(outer) if hosts is None and hostfile is None else None
    slots = allocation.hosts if allocation else host_list(hosts, hostfile)
    try:
        n, hostname = resolve_hosts(np, slots)
    except ConfigError as exc:
        if allocation is None:
            raise
        raise ConfigError(
            f"{exc} (hosts from the {allocation.source}; give -H to override, or start the ranks with srun)"
        ) from None
    env = without_launcher_variables(outer)
    try:
        resolved = Config.resolve(env=outer, overrides=dict(settings))
        start_timeout, grace, oversubscribe = resolved.start_timeout, resolved.grace_period, resolved.oversubscribe
        merge_stderr = resolved.merge_stderr
        system_metrics, interval = resolved.system_metrics or None, resolved.system_metrics_interval
    except (ConfigError, TypeError):
        start_timeout, grace, oversubscribe = 30.0, 30.0, False  # the workers report the bad setting themselves
        merge_stderr, system_metrics, interval = False, None, 0.5
    ssh = SshOptions(ssh_port, ssh_identity_file, tuple(ssh_options), start_timeout)
    if elastic and observer is not None:
        raise ConfigError("hora run --record does not record elastic jobs yet; leave out --record or the elastic "
                          "options (--min-np, --max-np, --host-discovery-script)")
    if elastic and system_metrics:
        raise ConfigError(
            "--system-metrics (HORA_SYSTEM_METRICS) is not supported for elastic jobs yet: leave it out, or run the "
            "job without --min-np/--max-np/--host-discovery-script"
        )
    if elastic:
        return _run_elastic(
            command,
            np,
            slots,
            outer,
            output_filename,
            capture,
            verbose,
            timeout,
            cwd,
            rendezvous_port,
            elastic,
            settings,
            ssh,
            network_interface,
            start_timeout,
        )
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
        grace=grace,
        timeout=timeout,
        cwd=cwd,
        rendezvous_port=rendezvous_port,
        hosts=slots or None,
        ssh=ssh,
        network_interface=network_interface,
        start_timeout=start_timeout,
        oversubscribe=oversubscribe,
        merge_stderr=merge_stderr,
        observer=observer,
        system_metrics=system_metrics,
        system_metrics_interval=interval,
    )
    try:
        result = launch(spec)
    except BaseException as exc:
        if observer is not None:
            observer.ended(2, f"{type(exc).__name__}: {exc}")
        raise
    if observer is not None:
        observer.ended(result.exit_code, result.report())
    return result


def _run_elastic(
    command: Sequence[str],
    np: int | None,
    slots: Sequence[HostSlots],
    outer: Mapping[str, str],
    output_filename: str | None,
    capture: bool,
    verbose: bool,
    timeout: float | None,
    cwd: str | None,
    rendezvous_port: int,
    elastic: Mapping[str, Any],
    settings: Mapping[str, Any],
    ssh: SshOptions,
    network_interface: str | None,
    start_timeout: float,
) -> RunResult:
    from hora.runner.elastic import ElasticSpec, launch_elastic

    if slots and elastic.get("host_discovery_script"):
        raise ConfigError("give the hosts of an elastic job either with --host-discovery-script or with -H, not both")
    spec = ElasticSpec(
        list(command),
        np=np,
        min_np=elastic.get("min_np"),
        max_np=elastic.get("max_np"),
        discovery_script=elastic.get("host_discovery_script"),
        hosts=slots or None,
        slots_per_host=elastic.get("slots_per_host") or 1,
        reset_limit=elastic.get("reset_limit"),
        cooldown_range=elastic.get("blacklist_cooldown_range"),
        env=without_launcher_variables(outer),
        settings=dict(settings),
        output_filename=output_filename,
        capture=capture,
        verbose=verbose,
        timeout=timeout,
        cwd=cwd,
        rendezvous_port=rendezvous_port,
        ssh=ssh,
        network_interface=network_interface,
        start_timeout=start_timeout,
    )
    return launch_elastic(spec)


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
        KeyboardInterrupt: Ctrl-C (SIGINT) while the ranks ran: they are stopped first, then the signal goes to the
            caller's handler as if hora had not caught it (likewise SIGTERM).
    """
    workdir = tempfile.mkdtemp(prefix="hora-run-")
    try:
        with open(os.path.join(workdir, "fn.pkl"), "wb") as f:
            _pickler.dump((fn, tuple(args), dict(kwargs or {})), f)
        base = dict(environment() if env is None else env)
        path = [p for p in sys.path if p]
        if base.get("PYTHONPATH"):
            path.append(base["PYTHONPATH"])
        base["PYTHONPATH"] = os.pathsep.join(path)
        command = [sys.executable, "-m", "hora.runner.function_worker", workdir]
        result = run_command(command, np, hosts, base, None, capture, verbose, timeout, None, **settings)
        if result.interrupted is not None:
            # The launcher caught the signal to stop the ranks; now that they are gone, hand it to the caller's own
            # handler (Ctrl-C raises KeyboardInterrupt here, as it would have without hora).
            signal.raise_signal(result.interrupted)
        if result.exit_code != 0:
            raise RunError(result.report() or f"the job failed with exit code {result.exit_code}", result)
        out = []
        for rank in range(len(result.returncodes)):
            with open(os.path.join(workdir, f"result.{rank}.pkl"), "rb") as f:
                out.append(pickle.load(f))
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
