"""The spec's ``profiler_config``: SageMaker Debugger's ``ProfilerConfig``, of which hora honours the system
monitoring (every host samples CPU, memory, network and disk; :mod:`hora.runner.system_metrics`).

- ``system_monitor_interval_millis`` (the API's ``ProfilingIntervalInMilliseconds``): one of the values the
  service accepts, 100, 200, 500, 1000, 5000 or 60000; default 500, as SageMaker's.
- ``disable_profiler`` (``DisableProfiler``): true turns the sampling off.
- ``s3_output_path`` (``S3OutputPath``), ``framework_profile_params`` and ``profile_params``
  (``ProfilingParameters``) are accepted and have no effect: the samples go to the job store, and hora has no
  framework profiler.

The Estimator's ``profiler_config=`` (an SDK ``ProfilerConfig``, or a mapping of these fields) and
``disable_profiler=`` become this field (:func:`estimator_profiler_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hora.errors import ConfigError
from hora.jobs.checks import Checker, type_name, unknown_field

__all__ = ["DEFAULT_INTERVAL_MILLIS", "INTERVALS_MILLIS", "estimator_profiler_config", "parse_profiler_config"]

#: SageMaker's default sampling interval (ProfilerConfig, CreateTrainingJob's ProfilingIntervalInMilliseconds).
DEFAULT_INTERVAL_MILLIS = 500
#: The intervals CreateTrainingJob accepts ("Available values are 100, 200, 500, 1000, 5000 and 60000").
INTERVALS_MILLIS = (100, 200, 500, 1000, 5000, 60000)
#: The SDK's ProfilerConfig arguments, and the CreateTrainingJob names that mean the same.
FIELDS = ("system_monitor_interval_millis", "disable_profiler", "s3_output_path", "framework_profile_params",
          "profile_params")
API_NAMES = {
    "ProfilingIntervalInMilliseconds": "system_monitor_interval_millis",
    "DisableProfiler": "disable_profiler",
    "S3OutputPath": "s3_output_path",
    "ProfilingParameters": "profile_params",
}


def parse_profiler_config(value: Any, c: Checker) -> int | None:
    """The sampling interval in milliseconds that ``profiler_config`` (the spec's value) asks for, None when it
    disables the system monitoring; problems go to ``c``."""
    if value is None:
        return DEFAULT_INTERVAL_MILLIS
    if not isinstance(value, Mapping):
        c.add(f"profiler_config must be a mapping such as {{system_monitor_interval_millis: 500}}, "
              f"got {type_name(value)}")
        return DEFAULT_INTERVAL_MILLIS
    fields: dict[str, Any] = {}
    for key, item in value.items():
        name = API_NAMES.get(str(key), str(key))
        if name not in FIELDS:
            c.add(unknown_field(str(key), FIELDS, " in profiler_config"))
        elif name in fields:
            c.add(f"profiler_config gives {name} twice (as {key} too); give it once")
        else:
            fields[name] = item
    disable = fields.get("disable_profiler", False)
    if disable is None:
        disable = False
    if not isinstance(disable, bool):
        c.add(f"profiler_config.disable_profiler must be true or false, got {disable!r} ({type_name(disable)})")
        disable = False
    interval = fields.get("system_monitor_interval_millis")
    if interval is None:
        interval = DEFAULT_INTERVAL_MILLIS
    elif isinstance(interval, bool) or not isinstance(interval, int) or interval not in INTERVALS_MILLIS:
        c.add(f"profiler_config.system_monitor_interval_millis must be one of "
              f"{', '.join(map(str, INTERVALS_MILLIS))} (milliseconds, the values SageMaker accepts), "
              f"got {interval!r}")
        interval = DEFAULT_INTERVAL_MILLIS
    return None if disable else interval


def estimator_profiler_config(profiler_config: Any, disable_profiler: Any) -> dict[str, Any] | None:
    """The spec's ``profiler_config`` from the Estimator's ``profiler_config=`` (an SDK ``ProfilerConfig``, whose
    attributes are read, or a mapping) and ``disable_profiler=``; None when neither is given.

    Raises:
        ConfigError: ``disable_profiler=True`` with a ``profiler_config`` that does not disable it too (the SDK
            raises RuntimeError for this when the job starts).
    """
    if profiler_config is None and disable_profiler is None:
        return None
    fields: dict[str, Any] = {}
    if isinstance(profiler_config, Mapping):
        fields = dict(profiler_config)
    elif profiler_config is not None:
        for name in FIELDS:
            if getattr(profiler_config, name, None) is not None:
                fields[name] = getattr(profiler_config, name)
        if not fields and not hasattr(profiler_config, "system_monitor_interval_millis"):
            raise ConfigError(
                f"profiler_config must be a sagemaker.debugger.ProfilerConfig or a mapping of its fields "
                f"({', '.join(FIELDS)}), got {type_name(profiler_config)}"
            )
    if disable_profiler is not None and not isinstance(disable_profiler, bool):
        raise ConfigError(f"disable_profiler must be True or False, got {disable_profiler!r}")
    if disable_profiler:
        if profiler_config is not None and not fields.get("disable_profiler", fields.get("DisableProfiler")):
            raise ConfigError(
                "profiler_config.disable_profiler cannot be False when disable_profiler is True (as the SDK "
                "says); pass disable_profiler=True alone to turn the system monitoring off"
            )
        fields["disable_profiler"] = True
    return fields
