"""Elastic functions run by engines' elastic executors (hora.ray.ElasticRayExecutor, hora.spark.run_elastic): each
step allreduces ``rank + 1`` into the state and commits, and rank 0 logs ``step size`` to ``out/log``. Each returns
(final rank, size, total, steps)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def _loop(
    out: str, steps: int, after_step: Callable[[object, object], None], until_size: int = 0, log_to_driver: bool = False
):
    import numpy as np

    import hora.numpy as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, total=0.0)
    give_up = time.monotonic() + 120.0

    @hvd.elastic.run
    def loop(state):
        while state.step < steps or (hvd.size() < until_size and time.monotonic() < give_up):
            state.total += float(hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name="g")[0])
            after_step(hvd, state)
            if hvd.rank() == 0:
                with open(Path(out) / "log", "a") as f:
                    f.write(f"{state.step} {hvd.size()}\n")
                if log_to_driver:  # hora.ray's executors: the same to the driver's callbacks
                    from hora.ray import ray_logger

                    ray_logger.log((state.step, hvd.size()))
            state.step += 1
            if state.step >= steps:
                time.sleep(0.1)  # waiting for hosts to come back: no need to spin
            state.commit()

    loop(state)
    return hvd.rank(), hvd.size(), state.total, state.step


def train(
    out: str, kill_host: str = "", kill_step: int = -1, steps: int = 12, log_to_driver: bool = False
) -> tuple[int, int, float, int]:
    """The worker whose slot starts with ``kill_host`` SIGKILLs itself after the allreduce of step ``kill_step``
    (once: a marker file ``out/killed`` holds its slot); ``log_to_driver``: rank 0 also sends ``(step, size)``
    through hora.ray.ray_logger."""
    slot = os.environ["HORA_ELASTIC_SLOT"]
    marker = Path(out) / "killed"

    def after_step(hvd, state):
        if kill_host and slot.startswith(kill_host + ":") and state.step == kill_step and not marker.exists():
            marker.write_text(slot)
            os.kill(os.getpid(), signal.SIGKILL)

    return _loop(out, steps, after_step, log_to_driver=log_to_driver)


def executor_above(pid: int) -> int:
    """The Spark executor JVM (CoarseGrainedExecutorBackend) above process ``pid``."""
    while pid > 1:
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        pid = int(stat[stat.rindex(b")") + 2 :].split()[1])
    raise RuntimeError("no Spark executor above this process")


def train_through_a_lost_executor(out: str, kill_step: int, steps: int, until_size: int) -> tuple[int, int, float, int]:
    """Rank 1 SIGKILLs its Spark executor (the JVM above it: the task, its Python worker and this process go with
    it) after step ``kill_step``, once (``out/killed`` holds its slot); the loop goes on past ``steps`` until
    ``until_size`` ranks take part again (for at most 120 s)."""
    slot = os.environ["HORA_ELASTIC_SLOT"]
    marker = Path(out) / "killed"

    def after_step(hvd, state):
        if hvd.rank() == 1 and state.step == kill_step and not marker.exists():
            marker.write_text(slot)
            os.kill(executor_above(os.getpid()), signal.SIGKILL)
            # This process goes with its executor, but not at once: on a loaded machine it could run the last
            # steps with rank 0 first, which then ends the job as a success with no round 2. It ends here.
            os.kill(os.getpid(), signal.SIGKILL)

    return _loop(out, steps, after_step, until_size)


def refuse() -> None:
    """Every worker raises after init (hora.spark.run_elastic: all of them fail, their executors are blacklisted)."""
    import hora.numpy as hvd

    hvd.init()
    raise ValueError(f"worker of rank {hvd.rank()} refuses")
