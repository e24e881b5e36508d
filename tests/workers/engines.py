"""Functions the Ray and Spark tests run on every rank (importable by name in the actors and Spark tasks)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

import hora.numpy as hvd
from hora._runtime.context import current


def topology(tag: object = None) -> dict[str, object]:
    """This rank's place and the sum of every rank's rank (a real allreduce), with ``tag`` echoed back."""
    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum)
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "sum": float(total[0]),
        "pid": os.getpid(),
        "transport": current().transport,
        "tag": tag,
    }


def fail_on(bad_rank: int) -> int:
    """Rank ``bad_rank`` raises ValueError; the others wait for it in an allreduce."""
    hvd.init()
    if hvd.rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} refuses")
    hvd.allreduce(np.ones(4), name="never")
    return hvd.rank()


def allreduce_loop(marker_dir: str, steps: int) -> int:
    """Allreduce ``steps`` times; after the first, each rank writes ``marker_dir/started.<rank>`` (so a test knows
    the ranks are inside the loop)."""
    hvd.init()
    for step in range(steps):
        hvd.allreduce(np.full(1024, float(step)), name="loop")
        if step == 0:
            Path(marker_dir, f"started.{hvd.rank()}").write_text(str(os.getpid()))
        time.sleep(0.01)
    return hvd.rank()


def wait_for(path: Path, seconds: float = 120.0) -> None:
    """Until ``path`` exists (the driver side of :func:`allreduce_loop`); raise after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


class Counter:
    """An ``executable_cls`` for RayExecutor.start(): one instance per worker, kept between calls."""

    def __init__(self, start: int) -> None:
        self.value = start

    def bump(self) -> int:
        self.value += 1
        return self.value


def fail_after_start(marker_dir: str, bad_rank: int) -> int:
    """Every rank writes ``marker_dir/started.<rank>`` (its pid) after a first allreduce; then ``bad_rank`` raises
    while the others wait for it in the next one."""
    hvd.init()
    hvd.allreduce(np.ones(4), name="first")
    Path(marker_dir, f"started.{hvd.rank()}").write_text(str(os.getpid()))
    if hvd.rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} refuses")
    hvd.allreduce(np.ones(4), name="never")
    return hvd.rank()


def pids(marker_dir: str | Path) -> dict[int, int]:
    """rank -> pid, from the ``started.<rank>`` files the functions above write."""
    return {int(p.name.split(".")[1]): int(p.read_text()) for p in Path(marker_dir).glob("started.*")}


def digits_train():
    """examples/engines_digits.py's ``train``, pickled by value (examples/ is not a package the ranks import)."""
    import importlib.util
    import sys

    from support import paths

    if "engines_digits" not in sys.modules:
        spec = importlib.util.spec_from_file_location("engines_digits", paths.REPO / "examples" / "engines_digits.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["engines_digits"] = module
        spec.loader.exec_module(module)
        for pickler in ("cloudpickle", "ray.cloudpickle", "pyspark.cloudpickle"):  # Ray and PySpark vendor their own
            try:
                importlib.import_module(pickler).register_pickle_by_value(module)
            except ImportError:
                pass
    return sys.modules["engines_digits"].train


def log_twice(executable: object) -> None:
    """Send (rank, 0) and (rank, 1) to the driver's callbacks (hora.ray.ray_logger, Horovod's)."""
    import hora.numpy as hvd
    from hora.ray import ray_logger

    for i in range(2):
        ray_logger.log((hvd.rank(), i))
