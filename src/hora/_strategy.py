"""The ``strategy=`` / ``staleness=`` / ``consistency=`` arguments every adapter's ``DistributedOptimizer`` takes,
resolved the same way everywhere (argument > ``HORA_STRATEGY`` / ``HORA_PS_CONSISTENCY`` > default)."""

from __future__ import annotations

from typing import Any

from hora.errors import ConfigError

__all__ = ["STRATEGIES", "resolve_consistency", "resolve_strategy"]

#: strategy name -> what it does (for messages).
STRATEGIES = ("allreduce", "parameter_server", "hybrid")


def resolve_strategy(strategy: str | None, allowed: tuple[str, ...] = STRATEGIES) -> str:
    """``strategy``, or the job's setting (``HORA_STRATEGY``, ``hora run --strategy``) when None."""
    if strategy is None:
        from hora._runtime.context import current, is_initialized

        strategy = current().config.strategy if is_initialized() else "allreduce"
    if strategy not in allowed:
        raise ValueError(f"strategy must be one of {', '.join(repr(s) for s in allowed)}; got {strategy!r}")
    return strategy


def resolve_consistency(client: Any, staleness: int | None, consistency: str | None) -> str:
    """The consistency string to register variables with: ``consistency`` (``async``, ``sync``, ``bounded(k)``),
    else ``bounded(staleness)`` when ``staleness`` is given, else the client's default (``HORA_PS_CONSISTENCY``)."""
    from hora.ps.client import parse_consistency

    if staleness is not None and (
        isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0
    ):
        raise ConfigError(f"staleness must be a non-negative int (the k of bounded(k)), got {staleness!r}")
    if consistency is None:
        if staleness is not None:
            return f"bounded({staleness})"
        return f"bounded({client.staleness})" if client.mode == "bounded" else str(client.mode)
    mode, k = parse_consistency(consistency, staleness)
    if staleness is not None and mode == "bounded" and k != staleness:
        raise ConfigError(f"consistency={consistency!r} and staleness={staleness} disagree; give one of them")
    return f"bounded({k})" if mode == "bounded" else mode
