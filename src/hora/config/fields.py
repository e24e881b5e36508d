"""The pieces a setting is declared with (:func:`setting`, its :class:`Flag`) and the reading of settings from the
environment and explicit arguments (:func:`read_settings`); the settings are declared in groups
(:mod:`.runtime_settings`, :mod:`.engine_settings`, :mod:`.ps_settings`, :mod:`.launch_settings`) that
:class:`hora.config.settings.Config` joins."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hora.config import parsers

__all__ = ["Flag", "absolute_path", "read_settings", "setting"]


@dataclass(frozen=True)
class Flag:
    """The ``hora run`` flag that sets a setting for the workers.

    ``action``: ``value`` (takes an argument, parsed like the setting's variable unless ``convert`` is given),
    ``store_true`` (present means True) or ``boolean_optional`` (``--x`` / ``--no-x``). ``convert`` turns the flag's
    text into the setting's value (e.g. MiB into bytes) and raises ``ValueError`` on bad text; ``show_default``
    renders the default in the flag's unit; ``unit`` notes how the variable differs from the flag. ``group`` is
    ``run`` for the launcher's own options, ``engine`` for the engine settings group.
    """

    name: str
    help: str
    metavar: str | None = None
    group: str = "engine"
    action: str = "value"
    choices: tuple[str, ...] = ()
    convert: Callable[[str], Any] | None = None
    show_default: Callable[[Any], str] | None = None
    unit: str = ""


def megabytes_flag(name: str, help: str) -> Flag:
    """A flag given in MiB (``--NAME-mb MB``) for a setting kept in bytes."""
    return Flag(
        name,
        help,
        metavar="MB",
        convert=parsers.megabytes,
        show_default=lambda b: f"{b / 2**20:g}",
        unit="in bytes",
    )


def absolute_path(path: str) -> str:
    """A path made absolute (empty stays empty: no file)."""
    return os.path.abspath(path) if path else ""


def setting(default: Any, parse: Callable[[str], Any], *env: str, help: str, flag: Flag | None = None) -> Any:
    return field(default=default, metadata={"env": env, "parse": parse, "help": help, "flag": flag})


def read_settings(
    fields_of: Iterable[dataclasses.Field[Any]], env: Mapping[str, str], overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Parse the settings found in ``env`` and ``overrides``.

    Returns (values, sources, problems): ``sources`` names the variable or argument each value came from, or is
    empty for a setting that was given an invalid value (which ``values`` then lacks).
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    fields = {f.name: f for f in fields_of}
    for f in fields.values():
        for name in f.metadata["env"]:  # declaration order: the HORA_* name before its HOROVOD_* alias
            if name in env:
                try:
                    values[f.name] = f.metadata["parse"](env[name])
                    sources[f.name] = name
                except ValueError as exc:
                    sources[f.name] = ""
                    problems.append(f"{name}={env[name]!r} is not valid: {exc}")
                break
    for key, value in overrides.items():
        if key not in fields:
            problems.append(f"unknown setting {key!r}; known settings: {', '.join(sorted(fields))}")
        elif value is not None:
            try:  # an argument is checked and normalised exactly like its environment variable
                values[key] = fields[key].metadata["parse"](str(value))
                if sources.get(key) != "":  # a broken variable stays an error even when an argument overrides it
                    sources[key] = key
            except ValueError as exc:
                values.pop(key, None)
                sources[key] = ""
                problems.append(f"{key}={value!r} is not valid: {exc}")
    return values, sources, problems
