"""The ``hora`` command: ``hora run -np N [-H localhost:N] command ...``."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from hora import __version__
from hora.config import Config, describe_settings, env_names, parse_value
from hora.errors import ConfigError, HoraError
from hora.jobs.cli import add_job_parser, job_main

#: The flag of ``hora run`` that sets each setting (the flag's value is exported as the setting's HORA_* variable).
FLAGS = {
    "start_timeout": "--start-timeout",
    "transport": "--transport",
    "log_level": "--log-level",
    "fusion_threshold": "--fusion-threshold-mb",
    "cycle_time_ms": "--cycle-time-ms",
    "cache_capacity": "--cache-capacity",
    "timeline": "--timeline-filename",
    "timeline_mark_cycles": "--timeline-mark-cycles",
    "stall_check_disable": "--no-stall-check",
    "stall_check_time": "--stall-check-warning-time-seconds",
    "stall_shutdown_time": "--stall-check-shutdown-time-seconds",
    "hierarchical_allreduce": "--hierarchical-allreduce",
    "hierarchical_allgather": "--hierarchical-allgather",
}

#: Settings the launcher itself gives every worker; what the launcher's environment says of them does not matter.
_SET_BY_LAUNCHER = ("hostname", "rendezvous_addr", "rendezvous_port", "secret", "job_id")


def _setting_type(setting: str) -> Callable[[str], Any]:
    """An argparse ``type`` that checks a flag's value exactly as the setting's environment variable is checked."""

    def parse(text: str) -> Any:
        try:
            return parse_value(setting, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not valid: {exc}") from None

    return parse


def _megabytes(text: str) -> int:
    """``--fusion-threshold-mb``: a number of MiB (whole or not) as bytes."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a finite number of MB >= 0")
    return int(value * 1024 * 1024)


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="start a command as N ranks",
        description="Start COMMAND as N ranks that find each other through hora's rendezvous.",
        epilog="Example: hora run -np 4 python train.py --epochs 3\n\nSettings (environment variables):\n"
        + describe_settings(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-np", "--num-proc", dest="np", type=int, help="number of ranks (default: the slots of -H, or of the Slurm allocation hora run is in)"
    )
    p.add_argument(
        "-H",
        "--hosts",
        help="host:slots list, e.g. h1:4,h2:4; other hosts are reached over SSH (docs/multihost.md)",
    )
    p.add_argument("--hostfile", metavar="FILE", help="hosts, one 'host slots=N' line each (instead of -H)")
    p.add_argument(
        "-p", "--ssh-port", type=int, metavar="PORT", help="SSH port of the remote hosts (default: ssh's)"
    )
    p.add_argument(
        "-i", "--ssh-identity-file", metavar="FILE", help="private key for SSH to the remote hosts"
    )
    p.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra ssh -o option, e.g. UserKnownHostsFile=/path (repeatable)",
    )
    p.add_argument(
        "--network-interface",
        metavar="NIC",
        help="network interface whose address the rendezvous and the ranks bind (default: the route to the hosts)",
    )
    p.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<r>/{stdout,stderr}",
    )
    p.add_argument(
        "--start-timeout",
        type=_setting_type("start_timeout"),
        metavar="SECONDS",
        help="seconds every rank may take to reach the rendezvous (default 30; HORA_START_TIMEOUT)",
    )
    p.add_argument(
        "--transport", choices=["auto", "shm", "tcp"], help="data plane between ranks (default auto)"
    )
    p.add_argument(
        "--log-level",
        choices=["trace", "debug", "info", "warning", "error", "fatal"],
        help="level of hora's own log messages in the workers",
    )
    engine = p.add_argument_group(
        "engine settings",
        "Each flag sets the HORA_* variable named in its help for the workers; without the flag,\n"
        "the workers read that variable or its HOROVOD_* alias from the environment.",
    )
    engine.add_argument(
        "--fusion-threshold-mb",
        type=_megabytes,
        metavar="MB",
        help="fuse ready tensors into buffers of up to MB MiB; 0 disables fusion (default 64; HORA_FUSION_THRESHOLD, "
        "in bytes)",
    )
    engine.add_argument(
        "--cycle-time-ms",
        type=_setting_type("cycle_time_ms"),
        metavar="MS",
        help=(
            "milliseconds to gather asynchronous submissions into one negotiation cycle "
            "(default 1; HORA_CYCLE_TIME)"
        ),
    )
    engine.add_argument(
        "--cache-capacity",
        type=_setting_type("cache_capacity"),
        metavar="N",
        help="entries in the response cache; 0 disables it (default 1024; HORA_CACHE_CAPACITY)",
    )
    engine.add_argument(
        "--timeline-filename",
        metavar="PATH",
        help="record a timeline in PATH, relative to this directory (default: none; HORA_TIMELINE)",
    )
    engine.add_argument(
        "--timeline-mark-cycles",
        action="store_true",
        default=None,
        help="mark every engine cycle in the timeline (HORA_TIMELINE_MARK_CYCLES)",
    )
    engine.add_argument(
        "--no-stall-check",
        action="store_true",
        default=None,
        help="turn off the stall check (HORA_STALL_CHECK_DISABLE)",
    )
    engine.add_argument(
        "--stall-check-warning-time-seconds",
        type=_setting_type("stall_check_time"),
        metavar="S",
        help="warn when a collective has waited S seconds for some ranks (default 60; "
        "HORA_STALL_CHECK_TIME_SECONDS)",
    )
    engine.add_argument(
        "--stall-check-shutdown-time-seconds",
        type=_setting_type("stall_shutdown_time"),
        metavar="S",
        help="shut the job down when a collective has waited S seconds for some ranks; 0 never, else at least the "
        "warning time (default 0; HORA_STALL_SHUTDOWN_TIME_SECONDS)",
    )
    engine.add_argument(
        "--hierarchical-allreduce",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on multi-host jobs, allreduce through shared memory within hosts and TCP across them, or (--no-...) "
        "over one flat TCP ring (default on; HORA_HIERARCHICAL_ALLREDUCE)",
    )
    engine.add_argument(
        "--hierarchical-allgather",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the same choice for allgather and broadcast (default on; HORA_HIERARCHICAL_ALLGATHER)",
    )
    p.add_argument(
        "--rendezvous-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port of the launcher's rendezvous store (default: a free port; see docs/multihost.md for firewalls)",
    )
    p.add_argument("--verbose", action="store_true", help="print what the launcher does")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hora", description="Distributed training with Horovod's API.")
    parser.add_argument("--version", action="version", version=f"hora {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _run_parser(sub)
    add_job_parser(sub)
    args = parser.parse_args(argv)
    if args.cmd == "run":
        return _run(parser, args)
    if args.cmd == "job":
        return job_main(args)
    return 2  # pragma: no cover


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from hora.runner import run_command

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("hora run: give the command to start, e.g. hora run -np 2 python train.py")
    settings = _settings(args)
    problem = _check_settings(settings)
    if problem:
        print(f"hora run: {problem}", file=sys.stderr)
        return 2
    try:
        result = run_command(
            command,
            np=args.np,
            hosts=args.hosts,
            output_filename=args.output_filename,
            verbose=args.verbose,
            rendezvous_port=args.rendezvous_port,
            hostfile=args.hostfile,
            ssh_port=args.ssh_port,
            ssh_identity_file=args.ssh_identity_file,
            ssh_options=args.ssh_option,
            network_interface=args.network_interface,
            **settings,
        )
    except HoraError as exc:
        print(f"hora run: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"hora run: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    report = result.report()
    if report:
        print(report, file=sys.stderr, flush=True)
    return result.exit_code


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given by flags (those not given are left to the workers' environment)."""
    timeline = args.timeline_filename
    if timeline:  # the workers may run elsewhere: they get the path as the launcher's directory sees it
        timeline = os.path.abspath(timeline)
    given = {
        "start_timeout": args.start_timeout,
        "transport": args.transport,
        "log_level": args.log_level.upper() if args.log_level else None,
        "fusion_threshold": args.fusion_threshold_mb,
        "cycle_time_ms": args.cycle_time_ms,
        "cache_capacity": args.cache_capacity,
        "timeline": timeline,
        "timeline_mark_cycles": args.timeline_mark_cycles,
        "stall_check_disable": args.no_stall_check,
        "stall_check_time": args.stall_check_warning_time_seconds,
        "stall_shutdown_time": args.stall_check_shutdown_time_seconds,
        "hierarchical_allreduce": args.hierarchical_allreduce,
        "hierarchical_allgather": args.hierarchical_allgather,
    }
    return {k: v for k, v in given.items() if v is not None}


def _check_settings(settings: dict[str, Any]) -> str:
    """Resolve the settings the workers will see (this environment, then the flags), so a bad value or a bad
    combination stops the launcher with one message instead of every rank; empty when all is well."""
    env = dict(os.environ)
    for setting in _SET_BY_LAUNCHER:
        for name in env_names(setting):
            env.pop(name, None)
    try:
        env.update(Config.env_for(settings))
        Config.resolve(env=env)
    except ConfigError as exc:
        message = str(exc)
        for setting, flag in FLAGS.items():  # "stall_check_time=30" came from a flag: say which
            if setting in settings:
                message = re.sub(rf"\b{setting}=", f"{flag} ", message)
        notes = [
            f"{flag} sets {env_names(setting)[0]}"
            for setting, flag in FLAGS.items()
            if setting in settings and env_names(setting)[0] in message
        ]
        return message + (f"\n({'; '.join(notes)})" if notes else "")
    return ""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
