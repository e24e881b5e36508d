"""hora for numpy arrays, with Horovod's names: ``import hora.numpy as hvd``.

The implementation lives in :mod:`hora._frontend`, which the other framework adapters share; this module is its
public face for numpy arrays (``tests/test_public_api.py`` pins the names). Every collective here also takes
``process_set=`` (a registered :class:`ProcessSet`; ``root_rank`` stays a global rank, as in Horovod).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from hora import _frontend
from hora._engine.handle import Handle as Handle  # re-exported
from hora._frontend import *  # noqa: F403
from hora._process_sets import ProcessSet as ProcessSet  # re-exported, as the next three
from hora._process_sets import add_process_set as add_process_set
from hora._process_sets import global_process_set as global_process_set
from hora._process_sets import remove_process_set as remove_process_set
from hora._process_sets import scope, set_root

_COLLECTIVES = [
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "reducescatter", "reducescatter_async",
]  # fmt: skip


def _on_process_sets(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a keyword ``process_set=``: it runs on that set (its root_rank translated to the set's index)."""
    sig = inspect.signature(fn)
    has_root = "root_rank" in sig.parameters

    @functools.wraps(fn)
    def on_set(*args: Any, process_set: ProcessSet | None = None, **kwargs: Any) -> Any:
        if process_set is None or process_set.process_set_id == 0:
            return fn(*args, **kwargs)
        if has_root:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            bound.arguments["root_rank"] = set_root(process_set, bound.arguments["root_rank"])
            args, kwargs = bound.args, bound.kwargs
        with scope(process_set):
            return fn(*args, **kwargs)

    extra = inspect.Parameter("process_set", inspect.Parameter.KEYWORD_ONLY, default=None)
    on_set.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])  # type: ignore[attr-defined]
    return on_set


for _name in _COLLECTIVES:
    globals()[_name] = _on_process_sets(getattr(_frontend, _name))

__all__ = sorted(
    [*_frontend.__all__, "Handle", "ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
)
