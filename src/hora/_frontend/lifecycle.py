"""Horovod's ``init(comm=None, process_sets=None)`` as every adapter answers it: start hora, then register the static
process sets (all of them or none)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hora._frontend.process_set import ProcessSet
from hora._frontend.registration import add_process_sets
from hora._runtime.context import init as _init
from hora.errors import UnsupportedError

__all__ = ["init"]


def init(comm: Any = None, process_sets: Iterable[ProcessSet] | str | None = None, **settings: Any) -> None:
    """Start hora in this process (idempotent; ``init()`` after ``shutdown()`` starts afresh). ``settings``
    override :class:`hora.Config` fields (e.g. ``transport="tcp"``).

    ``process_sets``: ProcessSets (or lists of ranks) to register now, in order, as every rank lists them; a set
    with the ranks of one registered before is bound to it (as Horovod does on a repeated ``init``). If any entry is
    invalid (a duplicate, a rank out of range) none is registered. ``"dynamic"`` is Horovod's switch for
    ``add_process_set`` after ``init``, which hora always allows."""
    if comm is not None:
        raise UnsupportedError(
            "init(comm=...) is not supported: hora takes its ranks from the launcher (hora run, mpirun, srun, "
            "torchrun); call init() without comm"
        )
    static = _static_sets(process_sets)
    _init(**settings)
    add_process_sets(static)


def _static_sets(process_sets: Iterable[ProcessSet] | str | None) -> list[ProcessSet]:
    if process_sets is None:
        return []
    if isinstance(process_sets, str):
        if process_sets.lower() == "dynamic":
            return []
        raise ValueError(
            f"init(process_sets={process_sets!r}): pass a list of ProcessSets, None, or 'dynamic'"
        )
    return [ps if isinstance(ps, ProcessSet) else ProcessSet(ps) for ps in process_sets]
