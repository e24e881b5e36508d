"""Every hora setting, declared once: its name, type, default, environment variables, help, and the ``hora run``
flag that sets it. The settings are declared in groups, one module each (:mod:`.runtime_settings`,
:mod:`.engine_settings`, :mod:`.ps_settings`, :mod:`.launch_settings`, with the pieces of :mod:`.fields`);
:class:`Config` is all of them, resolved, and this module is how the rest of hora reads them.

Precedence: an explicit argument (``init(**overrides)`` or ``Config.resolve(overrides=...)``) beats a ``hora run``
flag, which beats the environment, which beats the default. ``hora run`` turns its flags into ``HORA_*``
environment variables for the workers, so inside a worker "flag" and "environment" are the same source and the
launcher's flag wins because the launcher overwrites the inherited variable. Every ``HORA_*`` variable that has a
Horovod counterpart also accepts the ``HOROVOD_*`` name (the ``HORA_*`` name wins when both are set).

The ``hora run`` command line is generated from the :class:`Flag` of each setting (:mod:`hora.runner.flags`), so a
flag's help states the setting's real default and variable.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hora.config.engine_settings import EngineSettings
from hora.config.fields import Flag, read_settings
from hora.config.launch_settings import LaunchSettings
from hora.config.ps_settings import PsSettings
from hora.config.runtime_settings import RuntimeSettings
from hora.errors import ConfigError

__all__ = [
    "Config",
    "Flag",
    "describe_settings",
    "env_names",
    "flag_of",
    "parse_value",
    "render",
    "settings_with_flags",
]

log = logging.getLogger(__name__)


# The groups are listed last to first: a dataclass's fields start with those of its last base, so the settings
# keep their order (runtime, engine, parameter servers, launch), which hora run's --help and
# describe_settings() follow.
@dataclass(frozen=True)
class Config(LaunchSettings, PsSettings, EngineSettings, RuntimeSettings):
    """Resolved settings of one hora process. Build it with :meth:`Config.resolve`."""

    @classmethod
    def resolve(
        cls, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> Config:
        """Read every setting from ``env`` (default ``os.environ``), then apply explicit ``overrides``."""
        values, sources, problems = read_settings(
            dataclasses.fields(Config), os.environ if env is None else env, overrides or {}
        )
        problems += _cross_check(values, sources, with_defaults=True)
        if problems:
            raise ConfigError("invalid hora settings:\n  " + "\n  ".join(problems))
        return cls(**values)

    def public_dict(self) -> dict[str, Any]:
        """The settings without secrets, for logs."""
        data = dataclasses.asdict(self)
        if data.get("secret"):
            data["secret"] = "<hidden>"
        return data

    @classmethod
    def env_for(cls, settings: Mapping[str, Any]) -> dict[str, str]:
        """Explicit settings as ``HORA_*`` variables for a launcher's workers, validated first. Every given setting
        is exported, defaults included, so an explicit argument beats a variable the workers would inherit."""
        values, sources, problems = read_settings(dataclasses.fields(Config), {}, settings)
        # Only settings given together are checked against each other here: one that is not given comes from the
        # workers' environment, which the workers check when they resolve their Config.
        problems += _cross_check(values, sources, with_defaults=False)
        if problems:
            raise ConfigError("invalid hora settings:\n  " + "\n  ".join(problems))
        return {env_names(k)[0]: render(values[k]) for k, v in settings.items() if v is not None}

    def to_env(self) -> dict[str, str]:
        """The settings as ``HORA_*`` environment variables (what a launcher hands its workers)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            out[f.metadata["env"][0]] = render(value)
        return out


def render(value: Any) -> str:
    """A setting's value as its environment variable spells it (bools as 0/1)."""
    return str(int(value) if isinstance(value, bool) else value)


def _cross_check(values: Mapping[str, Any], sources: Mapping[str, str], with_defaults: bool) -> list[str]:
    """Problems between settings that are valid one by one. A setting that was not given takes its default when
    ``with_defaults`` and is not checked otherwise; one given an invalid value is not checked."""

    def get(name: str) -> tuple[float, str] | None:
        if sources.get(name) == "":
            return None
        if name in values:
            return values[name], f"{sources[name]}={values[name]:g}"
        if with_defaults:
            default = getattr(Config(), name)
            return default, f"the default {env_names(name)[0]}={default:g}"
        return None

    problems = []
    # a shutdown time left at its default follows a longer check time (the engine takes the larger), so only a
    # given one is checked
    shutdown = get("stall_shutdown_time") if "stall_shutdown_time" in values else None
    check = get("stall_check_time")
    if shutdown is not None and check is not None and 0 < shutdown[0] < check[0]:
        problems.append(
            f"{shutdown[1]} is less than {check[1]}: the stall shutdown time must be 0 (never) or not less "
            "than the stall check time (Horovod, too, refuses a shutdown time below the warning time); raise "
            "HORA_STALL_SHUTDOWN_TIME_SECONDS, lower HORA_STALL_CHECK_TIME_SECONDS, or set the shutdown time to 0"
        )
    return problems


def env_names(setting: str) -> tuple[str, ...]:
    """The environment variables that set ``setting`` (first is hora's own name)."""
    for f in dataclasses.fields(Config):
        if f.name == setting:
            return tuple(f.metadata["env"])
    raise KeyError(setting)


def parse_value(setting: str, text: str) -> Any:
    """Parse ``text`` as a value of ``setting`` exactly as its environment variable is parsed.

    Raises:
        ValueError: the text is not a valid value; the message says what is expected.
        KeyError: there is no such setting.
    """
    for f in dataclasses.fields(Config):
        if f.name == setting:
            return f.metadata["parse"](text)
    raise KeyError(setting)


def describe_settings() -> str:
    """A table of every setting, for ``hora run --help-settings`` and the docs."""
    lines = []
    for f in dataclasses.fields(Config):
        lines.append(f"{' / '.join(f.metadata['env'])} (default {f.default!r})\n    {f.metadata['help']}")
    return "\n".join(lines)


def flag_of(setting: str) -> Flag | None:
    """The ``hora run`` flag of ``setting`` (None when it has none)."""
    for f in dataclasses.fields(Config):
        if f.name == setting:
            flag: Flag | None = f.metadata["flag"]
            return flag
    raise KeyError(setting)


def settings_with_flags() -> list[tuple[str, Flag, Any]]:
    """(setting, its flag, its default) for every setting ``hora run`` has a flag for, in declaration order."""
    return [(f.name, f.metadata["flag"], f.default) for f in dataclasses.fields(Config) if f.metadata["flag"]]
