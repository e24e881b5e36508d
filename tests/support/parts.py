"""Several test workers in one launch: a launch costs seconds (a process per rank, its imports: torch, JAX,
TensorFlow take seconds each), re-initializing hora in a running rank a tenth of one.

A :class:`Part` is a worker function (importable by name in the ranks, like every ``workers.*`` function), its
arguments and, optionally, hora settings of its own. :func:`parts_worker` runs parts one after another in each rank;
each worker calls ``init()`` and ``shutdown()`` itself, so each part starts on a fresh group, as it would in a
launch of its own. A part's settings are written into the rank's environment while it runs, as the launcher writes
a launch's settings (``Config.env_for``), so its ``init()`` reads them where it would have. The first part that
fails stops its rank with an error naming the part and the rank (the launcher then stops the others and reports it
as the root cause): a failure cannot be skipped over, because the other ranks may wait in a collective the failed
rank will never submit.

:class:`Launches` (tests/support/harness.py) runs each group of parts once per test module, when the first test that
needs it asks, and hands every test the results of its own part.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Part:
    """``fn(*args)`` in every rank of a launch, its results known as ``name``."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default=())
    settings: dict[str, Any] = field(default_factory=dict)  # engine settings: fusion_threshold=0, transport="tcp"


class PartFailed(AssertionError):
    """A part raised in a rank; the message names the part, the rank and the error."""


def parts_worker(parts: list[Part]) -> dict[str, Any]:
    """Run ``parts`` in order in this rank; their results by name."""
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"part names must be unique, got {names}")
    from hora.config import Config

    out: dict[str, Any] = {}
    for part in parts:
        env = Config.env_for(part.settings)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            out[part.name] = part.fn(*part.args)
        except Exception as exc:
            rank = os.environ.get("HORA_RANK", os.environ.get("RANK", "?"))
            raise PartFailed(f"part {part.name!r} failed on rank {rank}: {type(exc).__name__}: {exc}") from exc
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return out
