"""A job's ``custom_mpi_options``: ``hora run`` flags (``--fusion-threshold-mb 32 --transport tcp``), checked with
hora run's own parser so a typo is a spec error instead of a failed launch, plus mpirun's ``-x NAME=VALUE`` /
``-x NAME`` (export a variable to every rank; a bare name takes its value from this environment, as mpirun does),
which SageMaker specs use to switch Horovod's features (``-x HOROVOD_TIMELINE=...``)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from hora.config.variables import environment
from hora.errors import ConfigError
from hora.runner.flags import LAUNCHER_OPTIONS, parse_run_options, settings_from_args

__all__ = ["parse_custom_mpi_options"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_custom_mpi_options(options: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(hora run settings, exported variables, problems) of ``options``."""
    problems: list[str] = []
    try:
        words = shlex.split(options)
    except ValueError as exc:
        return {}, {}, [f"custom_mpi_options {options!r} cannot be split into words: {exc}"]
    exports, rest = _exports(words, problems)
    try:
        args = parse_run_options(rest)
    except ConfigError as exc:
        problems.append(f"custom_mpi_options {options!r} are not valid hora run options: {exc}")
        return {}, exports, problems
    for option in LAUNCHER_OPTIONS:
        if getattr(args, option, None) is not None:
            problems.append(f"custom_mpi_options may not set {option}: hora job sets the ranks and hosts itself")
    return settings_from_args(args), exports, problems


def _exports(words: list[str], problems: list[str]) -> tuple[dict[str, str], list[str]]:
    """mpirun's ``-x`` options out of ``words``: (NAME -> value, the other words)."""
    exports: dict[str, str] = {}
    rest: list[str] = []
    it = iter(words)
    for word in it:
        if word != "-x":
            rest.append(word)
            continue
        item = next(it, None)
        if item is None:
            problems.append("custom_mpi_options: -x needs NAME=VALUE or NAME after it")
            break
        name, eq, value = item.partition("=")
        if not _ENV_NAME.match(name):
            problems.append(f"custom_mpi_options: -x {item!r} does not start with a variable name (NAME=VALUE or NAME)")
            continue
        if not eq:
            found = environment().get(name)
            if found is None:
                problems.append(
                    f"custom_mpi_options: -x {name} exports {name} from this environment, where it is not set"
                )
                continue
            value = found
        exports[name] = value
    return exports, rest
