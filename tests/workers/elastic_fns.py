"""Elastic functions run by engines' elastic executors (hora.ray.ElasticRayExecutor): each step allreduces
``rank + 1`` into the state and commits; the worker whose slot starts with ``kill_host`` SIGKILLs itself after the
allreduce of step ``kill_step`` (once: a marker file in ``out``). Returns (final rank, size, total, steps)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def train(out: str, kill_host: str = "", kill_step: int = -1, steps: int = 12) -> tuple[int, int, float, int]:
    import numpy as np

    import hora.numpy as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, total=0.0)
    slot = os.environ["HORA_ELASTIC_SLOT"]
    marker = Path(out) / "killed"

    @hvd.elastic.run
    def loop(state):
        while state.step < steps:
            state.total += float(hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name="g")[0])
            if kill_host and slot.startswith(kill_host + ":") and state.step == kill_step and not marker.exists():
                marker.write_text(slot)
                os.kill(os.getpid(), signal.SIGKILL)
            if hvd.rank() == 0:
                with open(Path(out) / "log", "a") as f:
                    f.write(f"{state.step} {hvd.size()}\n")
            state.step += 1
            state.commit()

    loop(state)
    return hvd.rank(), hvd.size(), state.total, state.step
