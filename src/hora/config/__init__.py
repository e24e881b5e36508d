"""Configuration: every setting (:mod:`.settings`), which launcher started this process (:mod:`.launchers`), the
variables a launcher hands its workers (:mod:`.worker_env`) and every other variable hora reads
(:mod:`.variables`). This package is the only place that reads the environment; everything else receives a
:class:`Config`, a :class:`LaunchInfo` or a value read here.
"""

from hora.config.settings import Config, Flag, describe_settings, env_names, flag_of, parse_value, render

__all__ = ["Config", "Flag", "describe_settings", "env_names", "flag_of", "parse_value", "render"]
