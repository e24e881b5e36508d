"""Every hora setting, declared once: its name, type, default, environment variables and help.

Precedence: an explicit argument (``init(**overrides)`` or ``Config.resolve(overrides=...)``) beats a ``hora run``
flag, which beats the environment, which beats the default. ``hora run`` turns its flags into ``HORA_*``
environment variables for the workers, so inside a worker "flag" and "environment" are the same source and the
launcher's flag wins because the launcher overwrites the inherited variable. Every ``HORA_*`` variable that has a
Horovod counterpart also accepts the ``HOROVOD_*`` name (the ``HORA_*`` name wins when both are set).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hora.errors import ConfigError

__all__ = ["Config", "describe_settings", "env_names"]

log = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")


def _parse_positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):  # also refuses nan and inf: every wait needs a real limit
        raise ValueError("expected a finite number > 0")
    return value


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("expected a whole number > 0")
    return value


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def _log_level(text: str) -> str:
    value = text.strip().upper()
    aliases = {"TRACE": "DEBUG", "WARN": "WARNING", "FATAL": "CRITICAL"}
    value = aliases.get(value, value)
    if value not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError("expected one of trace, debug, info, warning, error, fatal")
    return value


def _setting(default: Any, parse: Callable[[str], Any], *env: str, help: str) -> Any:
    return field(default=default, metadata={"env": env, "parse": parse, "help": help})


@dataclass(frozen=True)
class Config:
    """Resolved settings of one hora process. Build it with :meth:`Config.resolve`."""

    start_timeout: float = _setting(
        30.0,
        _parse_positive_float,
        "HORA_START_TIMEOUT",
        "HOROVOD_START_TIMEOUT",
        help="Seconds every rank may take to reach the rendezvous before start-up fails naming the missing ranks.",
    )
    op_timeout: float = _setting(
        300.0,
        _parse_positive_float,
        "HORA_OP_TIMEOUT_SECONDS",
        help="Seconds a rank waits for a peer inside an already negotiated collective before raising.",
    )
    transport: str = _setting(
        "auto",
        _choice("auto", "shm", "tcp"),
        "HORA_TRANSPORT",
        help="Data plane: 'shm' (shared memory, one host only), 'tcp', or 'auto' (shm when all ranks share a host).",
    )
    shm_chunk_bytes: int = _setting(
        2 << 20,
        _parse_positive_int,
        "HORA_SHM_CHUNK_BYTES",
        help="Bytes each rank stages per step in the shared-memory transport (its slot holds two such buffers).",
    )
    tcp_chunk_bytes: int = _setting(
        1 << 20,
        _parse_positive_int,
        "HORA_TCP_CHUNK_BYTES",
        help="Bytes per pipelined piece in the TCP ring.",
    )
    max_frame_bytes: int = _setting(
        64 << 20,
        _parse_positive_int,
        "HORA_MAX_FRAME_BYTES",
        help="Largest control or rendezvous frame accepted from a peer; longer length fields are rejected unread.",
    )
    log_level: str = _setting(
        "WARNING",
        _log_level,
        "HORA_LOG_LEVEL",
        "HOROVOD_LOG_LEVEL",
        help="Level of the 'hora' logger (trace, debug, info, warning, error, fatal).",
    )
    hostname: str = _setting(
        "",
        str,
        "HORA_HOSTNAME",
        "HOROVOD_HOSTNAME",
        help="Name of this host as the launcher knows it; ranks with the same name share memory. Default: the host name.",
    )
    rendezvous_addr: str = _setting(
        "",
        str,
        "HORA_RENDEZVOUS_ADDR",
        help="Address of the rendezvous store (set by 'hora run'). Without it, rank 0 hosts one and publishes it in HORA_RUNTIME_DIR.",
    )
    rendezvous_port: int = _setting(
        0,
        int,
        "HORA_RENDEZVOUS_PORT",
        help="Port of the rendezvous store (set by 'hora run').",
    )
    secret: str = _setting(
        "",
        str,
        "HORA_SECRET",
        help="Per-job secret, hex (set by 'hora run'; never put it on a command line).",
    )
    secret_file: str = _setting(
        "",
        str,
        "HORA_SECRET_FILE",
        help="Path of a 0600 file holding the per-job secret in hex (alternative to HORA_SECRET).",
    )
    job_id: str = _setting(
        "",
        str,
        "HORA_JOB_ID",
        help="Identifier of the job; rendezvous keys are namespaced by it (set by 'hora run').",
    )
    attempt: int = _setting(
        0,
        int,
        "HORA_ATTEMPT",
        help="Restart attempt of the job; rendezvous keys are namespaced by it.",
    )
    bind_addr: str = _setting(
        "",
        str,
        "HORA_BIND_ADDR",
        help="Address this rank's servers bind and advertise. Default: 127.0.0.1 when every rank is on this host.",
    )
    runtime_dir: str = _setting(
        "",
        str,
        "HORA_RUNTIME_DIR",
        help="Private (0700) directory for bootstrap files when no 'hora run' launched the job. Default: $TMPDIR/hora-<uid>.",
    )

    @classmethod
    def resolve(
        cls, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> Config:
        """Read every setting from ``env`` (default ``os.environ``), then apply explicit ``overrides``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[str] = []
        for f in dataclasses.fields(cls):
            for name in f.metadata["env"]:
                if name in env:
                    try:
                        values[f.name] = f.metadata["parse"](env[name])
                    except ValueError as exc:
                        problems.append(f"{name}={env[name]!r} is not valid: {exc}")
                    break
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in (overrides or {}).items():
            if key not in fields:
                problems.append(f"unknown setting {key!r}; known settings: {', '.join(sorted(fields))}")
            elif value is not None:
                try:  # an argument is checked and normalised exactly like its environment variable
                    values[key] = fields[key].metadata["parse"](str(value))
                except ValueError as exc:
                    problems.append(f"{key}={value!r} is not valid: {exc}")
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
        resolved = cls.resolve(env={}, overrides=settings)
        return {env_names(k)[0]: str(getattr(resolved, k)) for k, v in settings.items() if v is not None}

    def to_env(self) -> dict[str, str]:
        """The settings as ``HORA_*`` environment variables (what a launcher hands its workers)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            out[f.metadata["env"][0]] = str(int(value) if isinstance(value, bool) else value)
        return out


def env_names(setting: str) -> tuple[str, ...]:
    """The environment variables that set ``setting`` (first is hora's own name)."""
    for f in dataclasses.fields(Config):
        if f.name == setting:
            return tuple(f.metadata["env"])
    raise KeyError(setting)


def describe_settings() -> str:
    """A table of every setting, for ``hora run --help-settings`` and the docs."""
    lines = []
    for f in dataclasses.fields(Config):
        lines.append(f"{' / '.join(f.metadata['env'])} (default {f.default!r})\n    {f.metadata['help']}")
    return "\n".join(lines)
