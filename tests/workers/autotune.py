"""Worker functions for the autotune tests: training-like steps of named allreduces while rank 0 tunes."""

from __future__ import annotations

import sys

import numpy as np

import hora.numpy as hvd
from hora._runtime import context

#: a step's tensors: many small ones (fusion and the cache matter) and a few larger ones
SHAPES = [(64,)] * 12 + [(4096,)] * 4 + [(65536,)] * 2


def _step(step: int) -> int:
    """One step: every tensor submitted asynchronously, then all waited for and checked. Returns tensors checked."""
    me, n = hvd.rank(), hvd.size()
    handles = [
        hvd.allreduce_async(np.full(shape, me + step + i, np.float32), name=f"grad.{i}", op=hvd.Sum)
        for i, shape in enumerate(SHAPES)
    ]
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        expect = sum(r + step + i for r in range(n))
        assert np.all(out == expect), (step, i, out[:4], expect)
    return len(handles)


def _history() -> list[list[object]]:
    """(cycle, point) of every autotune switch on this rank, as plain lists."""
    return [[cycle, point.to_wire()] for cycle, point in context.current().engine.autotune.history]


def tuning_worker(steps: int) -> dict[str, object]:
    """Train for ``steps`` steps with autotune on; report the switches this rank applied and whether rank 0's
    tuner finished."""
    hvd.init()
    checked = sum(_step(s) for s in range(steps))
    link = context.current().engine.autotune
    out = {
        "history": _history(),
        "checked": checked,
        "tuning": link.tuner.active if link.tuner else None,
        "hierarchical": link.tuner.tunes_hierarchical if link.tuner else None,
        "transport": context.current().transport,
    }
    hvd.shutdown()
    return out


def no_sklearn_worker() -> str:
    """init() with autotune on and scikit-learn unimportable: every rank must refuse the same way."""
    from hora.errors import ConfigError

    sys.modules["sklearn"] = None  # type: ignore[assignment]  # makes "import sklearn" raise ImportError
    try:
        hvd.init()
    except ConfigError as exc:
        return str(exc)
    hvd.shutdown()
    return "started"
