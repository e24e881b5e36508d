"""The spec's ``distribution``: SageMaker's strategies (``mpi``/``allreduce`` — the same here: hora run starts every
rank — and ``parameter_server``), in the SDK's forms: a name, or a mapping of strategy -> options with ``enabled``,
and for ``parameter_server`` also the hyperparameter the SDK writes (``sagemaker_parameter_server_enabled``)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hora.jobs.checks import Checker, type_name, unknown_field
from hora.jobs.mpi_options import parse_custom_mpi_options

__all__ = ["PS_HYPERPARAMETER", "PS_SERVERS", "STRATEGIES", "Distribution", "parse_distribution"]

STRATEGIES = ("none", "mpi", "allreduce", "parameter_server")
DISTRIBUTION_FIELDS = ("enabled", "processes_per_host", "custom_mpi_options")
#: ``servers`` is hora's addition: whose parameter servers run beside the workers (tensorflow: SageMaker's).
PS_DISTRIBUTION_FIELDS = ("enabled", "servers")
PS_SERVERS = ("tensorflow", "hora")
#: The hyperparameter the SageMaker SDK writes for ``distribution={"parameter_server": {"enabled": True}}``.
PS_HYPERPARAMETER = "sagemaker_parameter_server_enabled"


@dataclass(frozen=True)
class Distribution:
    """What the spec's distribution (and the SDK's hyperparameter form of it) comes to."""

    strategy: str = "none"
    processes_per_host: int = 0  # 0: not given
    custom_mpi_options: str = ""
    run_settings: dict[str, Any] = field(default_factory=dict)  # hora run settings from custom_mpi_options
    mpi_exports: dict[str, str] = field(default_factory=dict)  # custom_mpi_options' -x NAME=VALUE, for every rank
    ps_servers: str = "tensorflow"
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)  # without the SDK's distribution entry


def parse_distribution(dist: Any, pph: int, hps: Mapping[str, Any], c: Checker) -> Distribution:
    """Check ``dist`` (the spec's ``distribution``) with the spec's ``processes_per_host`` (``pph``, 0 when not
    given) and hyperparameters; problems go to ``c``."""
    # distribution: "mpi" / {"mpi": {"enabled": true, "processes_per_host": 2, "custom_mpi_options": "..."}}
    #               / "parameter_server" / {"parameter_server": {"enabled": true}}
    strategy, mpi_options, ps_servers = "none", "", "tensorflow"
    if dist is None:
        pass
    elif isinstance(dist, str):
        if dist not in STRATEGIES:
            close = difflib.get_close_matches(dist, STRATEGIES, n=1)
            c.add(
                f"distribution {dist!r} is not one of {', '.join(STRATEGIES)}"
                + (f"; did you mean {close[0]!r}?" if close else "")
            )
        else:
            strategy = dist
    elif isinstance(dist, Mapping):
        chosen: list[str] = []
        for name, opts in dist.items():
            if name not in STRATEGIES[1:]:
                close = difflib.get_close_matches(str(name), STRATEGIES, n=1)
                c.add(
                    f"distribution strategy {name!r} is not one of {', '.join(STRATEGIES[1:])}"
                    + (f"; did you mean {close[0]!r}?" if close else "")
                )
                continue
            known = PS_DISTRIBUTION_FIELDS if name == "parameter_server" else DISTRIBUTION_FIELDS
            opts = {} if opts is None else opts
            if not isinstance(opts, Mapping):
                c.add(f"distribution.{name} must be a mapping ({', '.join(known)}), got {type_name(opts)}")
                continue
            for k in opts:
                if k not in known:
                    c.add(unknown_field(str(k), known, f" in distribution.{name}"))
            enabled = opts.get("enabled", True)
            if not isinstance(enabled, bool):
                c.add(f"distribution.{name}.enabled must be true or false, got {enabled!r}")
            elif enabled:
                chosen.append(name)
            if name == "parameter_server":
                ps_servers = opts.get("servers", "tensorflow")
                continue
            inner = (
                c.int_(opts, "processes_per_host", 0, 1, f" (in distribution.{name})")
                if opts.get("processes_per_host") is not None
                else 0
            )
            if inner and pph and inner != pph:
                c.add(f"processes_per_host is {pph} but distribution.{name}.processes_per_host is {inner}; give one")
            pph = pph or inner
            mpi_options = c.str_(opts, "custom_mpi_options", f" (in distribution.{name})") or ""
        if len(chosen) > 1:
            c.add(f"distribution enables {' and '.join(chosen)} at once; a job runs one distribution strategy: "
                  "keep one of them (or set enabled: false on the others)")
        elif chosen:
            strategy = chosen[0]
    else:
        c.add(f"distribution must be a strategy name or a mapping, got {type_name(dist)}")
    strategy, hps = _ps_hyperparameter(strategy, hps, c)
    if strategy == "parameter_server":
        if ps_servers not in PS_SERVERS:
            c.add(f"distribution.parameter_server.servers must be one of {', '.join(PS_SERVERS)}, got {ps_servers!r}")
        if pph > 1:
            c.add(f"distribution parameter_server runs one worker process per host, as SageMaker does, but "
                  f"processes_per_host is {pph}; drop processes_per_host (or use mpi / allreduce for several "
                  "processes per host)")
        if mpi_options:
            c.add("custom_mpi_options belong to mpi / allreduce, not to parameter_server")
    run_settings: dict[str, Any] = {}
    mpi_exports: dict[str, str] = {}
    if mpi_options:
        run_settings, mpi_exports, found = parse_custom_mpi_options(mpi_options)
        for problem in found:
            c.add(problem)
    servers = ps_servers if strategy == "parameter_server" else "tensorflow"
    return Distribution(strategy, pph, mpi_options, run_settings, mpi_exports, servers, hps)


def _ps_hyperparameter(strategy: str, hps: Mapping[str, Any], c: Checker) -> tuple[str, Mapping[str, Any]]:
    """The SDK's own form of the distribution, ``sagemaker_parameter_server_enabled`` among the hyperparameters
    (what ``TensorFlow(distribution={"parameter_server": {"enabled": True}})`` writes): the same as the
    ``distribution`` field, which must not say otherwise. It leaves the user's hyperparameters (the toolkit's
    files get it back from the strategy, as the SDK writes it); false is kept as it is."""
    if PS_HYPERPARAMETER not in hps:
        return strategy, hps
    value = hps[PS_HYPERPARAMETER]
    rest = {k: v for k, v in hps.items() if k != PS_HYPERPARAMETER}
    flag = (
        {True: True, False: False, "true": True, "false": False}.get(value)
        if isinstance(value, (bool, str))
        else None
    )
    if flag is None:
        c.add(f"hyperparameter {PS_HYPERPARAMETER} must be true or false, got {value!r}")
    elif flag and strategy not in ("none", "parameter_server"):
        c.add(f"hyperparameter {PS_HYPERPARAMETER} is true but distribution is {strategy}; a job runs one "
              "distribution strategy: drop one of them")
    elif flag:
        return "parameter_server", rest
    elif strategy == "parameter_server":
        c.add(f"hyperparameter {PS_HYPERPARAMETER} is false but distribution is parameter_server; drop one of them")
    return strategy, hps  # false: kept as given, as the SDK writes a disabled distribution
