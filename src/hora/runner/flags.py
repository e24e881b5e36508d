"""The ``hora run`` command line, generated from the settings' declarations (:class:`hora.config.Flag`): the
launcher's own options, one flag per setting that has one (its help states the setting's real default and
variable), the flag -> setting table, and turning parsed flags into settings. ``hora run`` (:mod:`hora.cli`) and
``hora job``'s ``custom_mpi_options`` (:mod:`hora.jobs.spec`) both use it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hora.config import Config, describe_settings, env_names, parse_value
from hora.config.settings import Flag, settings_with_flags
from hora.config.variables import environment
from hora.errors import ConfigError
from hora.runner.contradictions import check_launch

__all__ = [
    "LAUNCHER_OPTIONS",
    "add_run_arguments",
    "check_settings",
    "elastic_options",
    "flag_table",
    "help_text",
    "parse_run_options",
    "run_epilog",
    "settings_from_args",
]

#: ``hora run`` options that place and start ranks (not settings): hora job sets these itself.
LAUNCHER_OPTIONS = ("np", "hosts", "hostfile", "output_filename")

#: Settings the launcher itself gives every worker; what the launcher's environment says of them does not matter.
_SET_BY_LAUNCHER = ("hostname", "rendezvous_addr", "rendezvous_port", "secret", "job_id")


def flag_table() -> dict[str, str]:
    """setting -> the ``hora run`` flag that sets it."""
    return {setting: flag.name for setting, flag, _ in settings_with_flags()}


def _dest(flag: Flag) -> str:
    return flag.name.removeprefix("--").replace("-", "_")


def help_text(setting: str, flag: Flag, default: Any) -> str:
    """A flag's help: what it does, then its default (in the flag's unit) and the variable it sets."""
    variable = env_names(setting)[0] + (f", {flag.unit}" if flag.unit else "")
    if flag.action == "store_true":
        return f"{flag.help} ({variable})"
    return f"{flag.help} (default {_shown(flag, default)}; {variable})"


def _shown(flag: Flag, default: Any) -> str:
    if flag.show_default is not None:
        return flag.show_default(default)
    if isinstance(default, bool):
        return "on" if default else "off"
    return f"{default:g}" if isinstance(default, float) else str(default)


def _type(setting: str, flag: Flag) -> Any:
    """An argparse ``type`` that checks a flag's value exactly as the setting's variable is checked."""

    def parse(text: str) -> Any:
        try:
            return flag.convert(text) if flag.convert else parse_value(setting, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not valid: {exc}") from None

    return parse


def _add_setting_flags(parser: argparse.ArgumentParser, group_name: str, target: Any) -> None:
    for setting, flag, default in settings_with_flags():
        if flag.group != group_name:
            continue
        kwargs: dict[str, Any] = {"dest": _dest(flag), "help": help_text(setting, flag, default)}
        if flag.action == "store_true":
            kwargs.update(action="store_true", default=None)
        elif flag.action == "boolean_optional":
            kwargs.update(action=argparse.BooleanOptionalAction, default=None)
        elif flag.choices:
            kwargs.update(choices=list(flag.choices))
        else:
            kwargs.update(type=_type(setting, flag), metavar=flag.metavar)
        target.add_argument(flag.name, **kwargs)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Every argument of ``hora run``: the launcher's options, the setting flags and the command."""
    parser.add_argument(
        "-np",
        "--num-proc",
        dest="np",
        type=int,
        help="number of ranks (default: the slots of -H, or of the Slurm allocation hora run is in)",
    )
    parser.add_argument(
        "-H", "--hosts", help="host:slots list, e.g. h1:4,h2:4; other hosts are reached over SSH (docs/multihost.md)"
    )
    parser.add_argument("--hostfile", metavar="FILE", help="hosts, one 'host slots=N' line each (instead of -H)")
    parser.add_argument(
        "-p", "--ssh-port", type=int, metavar="PORT", help="SSH port of the remote hosts (default: ssh's)"
    )
    parser.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="private key for SSH to the remote hosts")
    parser.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra ssh -o option, e.g. UserKnownHostsFile=/path (repeatable)",
    )
    parser.add_argument(
        "--network-interface",
        metavar="NIC",
        help="network interface whose address the rendezvous and the ranks bind (default: the route to the hosts)",
    )
    parser.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<r>/{stdout,stderr}",
    )
    _add_setting_flags(parser, "run", parser)
    _add_elastic_arguments(parser)
    engine = parser.add_argument_group(
        "engine settings",
        "Each flag sets the HORA_* variable named in its help for the workers; without the flag,\n"
        "the workers read that variable or its HOROVOD_* alias from the environment.",
    )
    _add_setting_flags(parser, "engine", engine)
    parser.add_argument(
        "--rendezvous-port",
        type=_port,
        default=0,
        metavar="PORT",
        help="port of the launcher's rendezvous store (default: a free port; see docs/multihost.md for firewalls)",
    )
    parser.add_argument("--verbose", action="store_true", help="print what the launcher does")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")


#: The elastic options of ``hora run`` (Horovod's names); giving one of them makes the job elastic.
ELASTIC_OPTIONS = (
    "min_np",
    "max_np",
    "host_discovery_script",
    "slots_per_host",
    "reset_limit",
    "blacklist_cooldown_range",
)


def _add_elastic_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "elastic training",
        "Workers may fail, leave and join while the job goes on (scripts use hvd.elastic.run; docs/elastic.md).\n"
        "--host-discovery-script or --min-np makes the job elastic.",
    )
    group.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=int,
        metavar="N",
        help="fewest ranks training goes on with; below it the job waits for slots (default: -np)",
    )
    group.add_argument(
        "--max-np",
        "--max-num-proc",
        dest="max_np",
        type=int,
        metavar="N",
        help="most ranks the job grows to (default: every slot discovered)",
    )
    group.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="prints the usable hosts, one 'host' or 'host:slots' line each; run every second",
    )
    group.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=int,
        default=1,
        metavar="K",
        help="slots of a host the discovery script prints without ':slots' (default 1)",
    )
    group.add_argument(
        "--reset-limit", type=int, metavar="R", help="most times the job may reset before it fails (default: none)"
    )
    group.add_argument(
        "--blacklist-cooldown-range",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="seconds a failed host stays blacklisted, doubling per failure from MIN up to MAX (default: for good)",
    )


def elastic_options(args: argparse.Namespace) -> dict[str, Any]:
    """The elastic options given (empty for a static job)."""
    given = {k: getattr(args, k) for k in ELASTIC_OPTIONS if getattr(args, k, None) is not None}
    if not given.keys() - {"slots_per_host"}:
        return {}
    if given.get("blacklist_cooldown_range") is not None:
        given["blacklist_cooldown_range"] = tuple(given["blacklist_cooldown_range"])
    return given


def _port(text: str) -> int:
    """A TCP port, 0 for any free one (an argparse ``type``: a bad value is a usage error, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535; 0 picks a free port)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number: ports are 0-65535 (0 picks a free port)")
    return port


def run_epilog() -> str:
    return (
        "Example: hora run -np 4 python train.py --epochs 3\n\nSettings (environment variables):\n"
        + describe_settings()
    )


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given by flags (those not given are left to the workers' environment)."""
    out = {}
    for setting, flag, _ in settings_with_flags():
        value = getattr(args, _dest(flag), None)
        if value is not None:
            out[setting] = value
    return out


def parse_run_options(options: Sequence[str]) -> argparse.Namespace:
    """Parse ``hora run`` options (no command) as ``hora run`` would; ConfigError with argparse's message."""
    parser = argparse.ArgumentParser(prog="hora run", add_help=False)
    add_run_arguments(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args([*options, "--", "true"])
    except SystemExit:
        last = err.getvalue().strip().splitlines()[-1:] or ["not valid"]
        raise ConfigError(last[0].removeprefix("hora run: error: ")) from None


def check_settings(settings: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str:
    """Resolve the settings the workers will see (``env``, default this environment, then the flags), so a bad
    value or a bad combination (:mod:`hora.runner.contradictions`) stops the launcher with one message instead of
    every rank; empty when all is well."""
    base = dict(environment() if env is None else env)
    for setting in _SET_BY_LAUNCHER:
        for name in env_names(setting):
            base.pop(name, None)
    try:
        base.update(Config.env_for(settings))
        check_launch(Config.resolve(env=base), settings)
    except ConfigError as exc:
        message = str(exc)
        table = flag_table()
        for setting, flag in table.items():  # "stall_check_time=30" came from a flag: say which
            if setting in settings:
                message = re.sub(rf"\b{setting}=", f"{flag} ", message)
        notes = [
            f"{flag} sets {env_names(setting)[0]}"
            for setting, flag in table.items()
            if setting in settings and env_names(setting)[0] in message
        ]
        return message + (f"\n({'; '.join(notes)})" if notes else "")
    return ""
