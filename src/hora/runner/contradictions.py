"""Settings that contradict each other in a way no rank could run with, found by the launcher before any process
starts: ``hora run`` refuses them with one usage error (exit 2) instead of every rank failing seconds later, after
importing its framework. ``hora run`` (:func:`hora.runner.flags.check_settings`) and :func:`hora.runner.launch.launch`
(``hora.runner.run``/``run_command``, ``hora job``) both apply them.

What depends on the hosts (``--num-ps`` against ``--ps-per-host`` x hosts) is checked where the hosts are known
(:func:`hora.runner.hosts.place_servers`), still before anything starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hora.config import Config, env_names
from hora.config.ps_settings import PsSettings
from hora.config.settings import settings_with_flags
from hora.errors import ConfigError

__all__ = ["SERVER_SETTINGS", "check_launch"]

#: Settings that configure the parameter servers ``hora run`` starts: given as a flag to a job without servers,
#: they would do nothing.
SERVER_SETTINGS = tuple(
    f.name for f in dataclasses.fields(PsSettings) if f.name not in ("strategy", "num_ps", "ps_per_host")
)

_NO_SERVERS_FIX = "add --num-ps S (S servers beside the workers) or --ps-per-host K (K servers on every host)"


def _named(setting: str, given: Mapping[str, Any], value: Any) -> str:
    """How the user gave ``setting``: its ``hora run`` flag when the flags set it, else its variable."""
    if setting in given:
        flag = next((f.name for s, f, _ in settings_with_flags() if s == setting), None)
        if flag:
            return f"{flag} {value}"
    return f"{env_names(setting)[0]}={value} (from the environment)"


def check_launch(config: Config, given: Mapping[str, Any]) -> None:
    """Refuse a job whose resolved ``config`` contradicts itself. ``given``: the settings set by ``hora run``'s
    flags (or ``run_command``'s keyword arguments), so the message names what the user typed.

    Raises:
        ConfigError: what was given, why no rank could run with it, and the fix.
    """
    servers = config.num_ps > 0 or config.ps_per_host > 0
    if config.strategy == "parameter_server" and not servers:
        raise ConfigError(
            f"{_named('strategy', given, 'parameter_server')} needs parameter servers, and this job starts none: "
            f"{_NO_SERVERS_FIX}, e.g. 'hora run -np 2 --num-ps 1 --strategy parameter_server python train.py'; or "
            "leave the strategy at allreduce"
        )
    unused = [s for s in SERVER_SETTINGS if s in given] if not servers else []
    if unused:
        named = ", ".join(_named(s, given, given[s]) for s in unused)
        raise ConfigError(
            f"{named} configure{'s' if len(unused) == 1 else ''} parameter servers, and this job starts none: "
            f"{_NO_SERVERS_FIX}, or drop {'it' if len(unused) == 1 else 'them'}"
        )
    if config.ps_max_restarts and not config.ps_checkpoint_dir:
        raise ConfigError(
            f"{_named('ps_max_restarts', given, config.ps_max_restarts)} needs --ps-checkpoint-dir DIR "
            "(HORA_PS_CHECKPOINT_DIR): a restarted parameter server restores its shards from there"
        )
