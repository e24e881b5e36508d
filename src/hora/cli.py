"""The ``hora`` command: ``hora run -np N [-H localhost:N] command ...`` and ``hora job ...``. Parsing and printing
only: the flags come from :mod:`hora.runner.flags`, the work from :mod:`hora.runner` and :mod:`hora.jobs`."""

from __future__ import annotations

import argparse
import difflib
import sys

from hora import __version__
from hora._orphans import end_adopted
from hora._proc import become_subreaper
from hora.config import Config
from hora.config.variables import environment
from hora.dashboard.cli import add_dashboard_parser, dashboard_main
from hora.errors import HoraError
from hora.jobs.cli import add_job_parser, job_main
from hora.jobs.run_record import RunRecorder
from hora.jobs.store import JobStore
from hora.runner.flags import add_run_arguments, check_settings, elastic_options, run_epilog, settings_from_args


def _leaf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser that parsed the command given (``hora run``, ``hora job logs`` ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _leaf(action.choices[chosen], args)
    return parser


def _unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> int:
    """Unrecognized arguments: the usage of the command given, and the flag meant where one is close."""
    leaf = _leaf(parser, args)
    flags = [o for a in leaf._actions for o in a.option_strings if o.startswith("--")]
    lines = []
    for extra in extras:
        name = extra.split("=", 1)[0]
        close = difflib.get_close_matches(name, flags, n=2, cutoff=0.7) if name.startswith("-") else []
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        lines.append(f"{leaf.prog}: error: unrecognized argument {extra!r}{hint}")
    lines.append(f"(`{leaf.prog} --help` lists its flags)")
    print("\n".join(lines), file=sys.stderr)
    return 2


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="start a command as N ranks",
        description="Start COMMAND as N ranks that find each other through hora's rendezvous.",
        epilog=run_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hora", description="Distributed training with Horovod's API.")
    parser.add_argument("--version", action="version", version=f"hora {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _run_parser(sub)
    add_job_parser(sub)
    add_dashboard_parser(sub)
    args, extras = parser.parse_known_args(argv)
    if extras:
        return _unknown(parser, args, extras)
    if args.cmd == "run":
        return _run(parser, args)
    if args.cmd == "job":
        return job_main(args)
    if args.cmd == "dashboard":
        return dashboard_main(args)
    return 2  # pragma: no cover


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from hora.runner import run_command

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("hora run: give the command to start, e.g. hora run -np 2 python train.py")
    settings = settings_from_args(args)
    problem = check_settings(settings)
    if problem:
        print(f"hora run: {problem}", file=sys.stderr)
        return 2
    become_subreaper()  # a rank's double-forked daemon is ended with the job, not left under PID 1
    try:
        observer = _recorder(command, args.np, settings)
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
            elastic=elastic_options(args),
            observer=observer,
            **settings,
        )
    except HoraError as exc:
        print(f"hora run: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"hora run: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    except (PermissionError, IsADirectoryError) as exc:  # the shell's code for "found but cannot execute"
        print(f"hora run: cannot start {command[0]!r}: {exc.strerror} (is it an executable file? "
              f"`chmod +x {command[0]}`, or name its interpreter: `hora run ... python {command[0]}`)", file=sys.stderr)
        return 126
    left = end_adopted()
    if left:
        print(f"hora run: ended {len(left)} process(es) the ranks left running: {', '.join(left)}", file=sys.stderr)
    report = result.report()
    if report:
        print(report, file=sys.stderr, flush=True)
    return result.exit_code


def _recorder(command: list[str], np: int | None, settings: dict[str, object]) -> RunRecorder | None:
    """The job-store recorder of ``hora run --record`` (the record setting), or None."""
    if not Config.resolve(env=environment(), overrides=settings).record:
        return None
    recorder = RunRecorder(JobStore(), command, np)
    print(f"hora run: recording this run as {recorder.name} in {recorder.store.home} (hora dashboard shows it)",
          file=sys.stderr, flush=True)
    return recorder


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
