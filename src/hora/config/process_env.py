"""Writing a worker's variables into this very process, for ranks that a cluster engine starts (Ray actors, Spark
tasks): their environment cannot be given at start as ``hora run`` gives it, so the worker writes
:func:`hora.config.worker_env.worker_env`'s variables into itself before it runs the user's function, and puts the
old values back afterwards. Here, in :mod:`hora.config`, because only this package touches ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

__all__ = ["restore_process_env", "set_process_env"]


def set_process_env(changes: Mapping[str, str], remove: Iterable[str] = ()) -> dict[str, str | None]:
    """Write ``changes`` into this process's environment and delete ``remove``; return the previous values (for
    :func:`restore_process_env`)."""
    remove = list(remove)
    previous: dict[str, str | None] = {}
    for name in [*remove, *changes]:
        if name not in previous:
            previous[name] = os.environ.get(name)
    for name in remove:
        os.environ.pop(name, None)
    os.environ.update(changes)
    return previous


def restore_process_env(previous: Mapping[str, str | None]) -> None:
    """Undo :func:`set_process_env`: every variable it changed gets its old value back (or is deleted)."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
