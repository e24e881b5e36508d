"""The ``hora`` command: ``hora run -np N [-H localhost:N] command ...``."""

from __future__ import annotations

import argparse
import sys

from hora import __version__
from hora.config import describe_settings
from hora.errors import HoraError


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
        "-np", "--num-proc", dest="np", type=int, help="number of ranks (default: the slots of -H)"
    )
    p.add_argument(
        "-H", "--hosts", help="host:slots list; this version runs on this machine only (localhost:N)"
    )
    p.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<r>/{stdout,stderr}",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
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
    p.add_argument(
        "--rendezvous-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port of the launcher's rendezvous store on 127.0.0.1 (default: a free port)",
    )
    p.add_argument("--verbose", action="store_true", help="print what the launcher does")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hora", description="Distributed training with Horovod's API.")
    parser.add_argument("--version", action="version", version=f"hora {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _run_parser(sub)
    args = parser.parse_args(argv)
    if args.cmd == "run":
        return _run(parser, args)
    return 2  # pragma: no cover


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from hora.runner import run_command

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("hora run: give the command to start, e.g. hora run -np 2 python train.py")
    settings = {
        k: v
        for k, v in {
            "start_timeout": args.start_timeout,
            "transport": args.transport,
            "log_level": args.log_level.upper() if args.log_level else None,
        }.items()
        if v is not None
    }
    try:
        result = run_command(
            command,
            np=args.np,
            hosts=args.hosts,
            output_filename=args.output_filename,
            verbose=args.verbose,
            rendezvous_port=args.rendezvous_port,
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
