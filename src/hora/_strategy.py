"""What every adapter's ``DistributedOptimizer`` shares for the parameter-server strategies, framework-free.

The ``strategy=`` / ``staleness=`` / ``consistency=`` arguments, resolved the same way everywhere (argument >
``HORA_STRATEGY`` / ``HORA_PS_CONSISTENCY`` > default), and the hybrid strategy's row exchange: server-held tables
updated by the rows each worker touched. Per step and table, a worker pushes its touched rows (``push_rows``:
unique ids, summed gradients), learns the ids every worker touched (an allgather of ids only, 8 bytes a row) and
pulls exactly those rows back, which the adapter writes into its local table. Under ``sync`` the servers apply a
step's N pushes at once (rows summed in rank order, divided by N: averaging), so after the pull the local table
equals the servers'; under ``async`` each push is applied on arrival, and pushing before the allgather still
orders every worker's push before any pull.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hora.errors import ConfigError, UnsupportedError

__all__ = [
    "STRATEGIES",
    "check_mode",
    "cover_shards",
    "exchange_rows",
    "resolve_consistency",
    "resolve_strategy",
    "touched_rows",
]

#: strategy name -> what it does (for messages).
STRATEGIES = ("allreduce", "parameter_server", "hybrid")


def resolve_strategy(
    strategy: str | None,
    allowed: tuple[str, ...] = STRATEGIES,
    staleness: int | None = None,
    consistency: str | None = None,
    ps_parameters: Any = None,
    what: str = "DistributedOptimizer",
    instead: str = "",
) -> str:
    """``strategy``, or the job's setting (``HORA_STRATEGY``, ``hora run --strategy``) when None. A strategy that is
    not one of :data:`STRATEGIES` is a ``ValueError``; one that ``what`` does not implement (not in ``allowed``) is
    an :class:`~hora.errors.UnsupportedError` that says where it came from and ends with ``instead`` (what to use),
    never a silent allreduce; parameter-server arguments that do not fit the strategy are a ``ValueError``."""
    source = f"strategy={strategy!r}"
    if strategy is None:
        from hora._runtime.context import current, is_initialized

        strategy = current().config.strategy if is_initialized() else "allreduce"
        source = f"HORA_STRATEGY={strategy} (hora run --strategy {strategy})"
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(repr(s) for s in STRATEGIES)}; got {strategy!r}")
    if strategy not in allowed:
        raise UnsupportedError(
            f"{what} does not support {source}: it implements {', '.join(repr(s) for s in allowed)}"
            + (f"; {instead}" if instead else "")
        )
    if strategy == "parameter_server" and ps_parameters is not None:
        raise ValueError(
            "ps_parameters picks what the servers hold under strategy='hybrid'; parameter_server holds all"
        )
    if strategy == "allreduce" and (staleness is not None or consistency is not None or ps_parameters is not None):
        raise ValueError(
            "staleness, consistency and ps_parameters apply to strategy='parameter_server' or 'hybrid' only"
        )
    return strategy


def resolve_consistency(client: Any, staleness: int | None, consistency: str | None) -> str:
    """The consistency string to register variables with: ``consistency`` (``async``, ``sync``, ``bounded(k)``),
    else ``bounded(staleness)`` when ``staleness`` is given, else the client's default (``HORA_PS_CONSISTENCY``)."""
    from hora.ps.client import parse_consistency

    if staleness is not None and (isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0):
        raise ConfigError(f"staleness must be a non-negative int (the k of bounded(k)), got {staleness!r}")
    if consistency is None:
        if staleness is not None:
            return f"bounded({staleness})"
        return f"bounded({client.staleness})" if client.mode == "bounded" else str(client.mode)
    mode, k = parse_consistency(consistency, staleness)
    if staleness is not None and mode == "bounded" and k != staleness:
        raise ConfigError(f"consistency={consistency!r} and staleness={staleness} disagree; give one of them")
    return f"bounded({k})" if mode == "bounded" else mode


def check_mode(mode_text: str) -> str:
    """``sync`` or ``async`` from a resolved consistency; ``bounded(k)`` is refused (the allreduce keeps step)."""
    from hora.ps.client import parse_consistency

    mode, _k = parse_consistency(mode_text)
    if mode == "bounded":
        raise ConfigError(
            f"strategy='hybrid' with consistency {mode_text}: the dense allreduce already keeps the workers in step, "
            "so bounded staleness means nothing here; use consistency='sync' (equal to averaging) or 'async'"
        )
    return mode


def touched_rows(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique sorted ids, their rows summed) of a sparse gradient given as possibly repeated ids and rows."""
    ids = np.asarray(ids).astype(np.int64).reshape(-1)
    uniq, inverse = np.unique(ids, return_inverse=True)
    if len(uniq) == len(ids) and np.array_equal(uniq, ids):
        return uniq, np.ascontiguousarray(values)
    summed = np.zeros((len(uniq), *values.shape[1:]), values.dtype)
    np.add.at(summed, inverse.reshape(-1), values)
    return uniq, summed


def cover_shards(
    placement: list[tuple[int, int, int]], ids: np.ndarray, rows: np.ndarray, union: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Under ``sync`` a server applies a step once every worker pushed to the shard, so a worker that touched none
    of a shard's rows that another worker touched pushes a zero gradient for one of those rows: it adds nothing to
    the step's sum (the row is updated anyway), and shards nobody touched see no push from anyone."""
    extra = []
    for lo, hi, _server in placement:
        a, b = np.searchsorted(union, [lo, hi])
        if a < b and np.searchsorted(ids, lo) == np.searchsorted(ids, hi):
            extra.append(union[a])
    if not extra:
        return ids, rows
    zeros = np.zeros((len(extra), *rows.shape[1:]), rows.dtype)
    return np.concatenate([ids, np.array(extra, np.int64)]), np.concatenate([rows, zeros])


def exchange_rows(
    client: Any,
    name: str,
    mode: str,
    ids: np.ndarray,
    rows: np.ndarray,
    union_of: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Push this worker's rows of ``name`` (unique sorted ``ids``), pull every worker's touched rows; returns
    (union of ids, their values from the servers). ``union_of(ids)``: the sorted unique ids of every worker."""
    if mode == "sync":  # the union first: it says which shards need a (zero) push from this worker
        union = union_of(ids)
        ids, rows = cover_shards(client.placement(name), ids, rows, union)
        if len(ids):
            client.push_rows(name, ids, rows)
    else:  # push first: every worker's push is applied before anyone passes the allgather and pulls
        if len(ids):
            client.push_rows(name, ids, rows)
        union = union_of(ids)
    if not len(union):
        return union, np.zeros((0, *rows.shape[1:]), rows.dtype)
    return union, client.pull_rows(name, union)
