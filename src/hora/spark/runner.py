"""``hora.spark.run``: run a function on hora ranks that are the tasks of one Spark barrier stage (Horovod's
``horovod.spark.run``).

The driver checks that the cluster has a slot for every rank at once (a barrier stage needs them all; Spark itself
would retry for minutes), draws the job's secret, and submits ``num_proc`` barrier tasks running
:class:`~hora.spark.task.RankTask`. A failed stage becomes a :class:`~hora.errors.RunError` naming the rank: the
rank's own exception and traceback, or the executor Spark lost under it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora.errors import ConfigError, RunError
from hora.runner.in_process import JobRendezvous
from hora.spark.task import FAILURE_BEGIN, FAILURE_END, RankTask

__all__ = ["run", "slots"]

log = logging.getLogger(__name__)

#: Seconds to wait for enough executors to register when ``start_timeout`` is not given.
DEFAULT_START_TIMEOUT = 120.0

#: Spark's reason when a barrier stage fails for a task that did not raise (its executor was lost, say).
_FAILED_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\) finished unsuccessfully\.\s*(.*)")
_EXECUTOR = re.compile(r"\(executor (\S+) ")


def _context() -> Any:
    try:
        from pyspark import SparkContext
    except ImportError:
        raise ImportError(
            "hora.spark needs PySpark: pip install -c constraints.txt -e '.[spark]' in hora's checkout (PySpark 4.3, "
            "Java 17)"
        ) from None
    sc = SparkContext._active_spark_context
    if sc is None:
        raise ConfigError(
            "hora.spark.run needs an active SparkContext: create one first, e.g. "
            "SparkSession.builder.master('local-cluster[2,1,1024]').getOrCreate()"
        )
    return sc


def slots(sc: Any) -> int:
    """How many tasks the cluster can run at once now (what a barrier stage needs for all its tasks)."""
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:
        return int(sc.defaultParallelism)


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    use_mpi: Any = None,
    use_gloo: Any = None,
    extra_mpi_args: Any = None,
    prefix_output_with_timestamp: bool = False,
    executable: Any = None,
    **settings: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks, one per task of a Spark barrier stage; return every
    rank's value in rank order.

    Args:
        num_proc: number of ranks (default: the SparkContext's default parallelism, as Horovod).
        start_timeout: seconds to wait for the cluster to have ``num_proc`` free slots (default 120).
        env: extra environment variables of every rank (set in the task's Python worker while it runs).
        stdout, stderr: accepted for Horovod's signature; the ranks' output goes to the executors' logs.
        nics, use_mpi, use_gloo, extra_mpi_args, prefix_output_with_timestamp, executable: Horovod's; accepted
            and ignored (hora starts no mpirun or gloo processes: the tasks are the ranks).
        verbose: 0 silent, 1 (default) logs the start and end of the stage on the ``hora.spark`` logger.
        settings: hora settings for every rank (``transport="tcp"``, ``start_timeout=60`` ...).

    Raises:
        ConfigError: no active SparkContext, or fewer than ``num_proc`` slots within ``start_timeout``.
        RunError: the stage failed; the message names the rank and holds its traceback or Spark's reason.
    """
    sc = _context()
    n = int(num_proc or sc.defaultParallelism)
    if n < 1:
        raise ConfigError(f"num_proc must be at least 1, got {num_proc}")
    timeout = DEFAULT_START_TIMEOUT if start_timeout is None else float(start_timeout)
    _wait_for_slots(sc, n, timeout)
    job = JobRendezvous()  # the secret and job id; task 0 hosts the store itself
    task = RankTask(fn, args, dict(kwargs or {}), job.secret, job.job_id, dict(env or {}), settings)
    if verbose:
        log.info("hora.spark: running %d ranks as one barrier stage (job %s)", n, job.job_id)
    sc.setJobDescription(f"hora.spark.run: {n} ranks ({getattr(fn, '__name__', 'function')})")
    try:
        pairs = sc.parallelize(range(n), n).barrier().mapPartitions(task).collect()
    except Exception as exc:
        raise _stage_error(exc, n) from None
    finally:
        sc.setJobDescription(None)
    if verbose:
        log.info("hora.spark: the %d ranks finished", n)
    return [value for _, value in sorted(pairs, key=lambda p: p[0])]


def _wait_for_slots(sc: Any, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (have := slots(sc)) < n:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"hora.spark.run needs {n} slots at once (one barrier task per rank) but the cluster has {have} "
                f"after waiting {timeout:g}s (executor cores / spark.task.cpus, summed over the executors). Lower "
                "num_proc, add executors or cores, or raise start_timeout if executors are still starting."
            )
        time.sleep(0.2)


def _spark_text(exc: BaseException) -> str:
    """Everything Spark says about a failed job: py4j's message only names the call, the Java exception holds
    the stage's failure reason."""
    parts = [str(exc)]
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            parts.append(str(java.toString()))
        except Exception:
            pass
    return "\n".join(parts)


def _stage_error(exc: BaseException, n: int) -> RunError:
    text = _spark_text(exc)
    retried = ""
    if "Could not recover from a failed barrier ResultStage" in text:
        retried = " Spark did not retry the stage (a failed barrier result stage is not retried)."
    begin = text.find(FAILURE_BEGIN)
    if begin >= 0:
        end = text.find(FAILURE_END, begin)
        report = text[begin + len(FAILURE_BEGIN) : end if end >= 0 else None].strip()
        head, _, rest = report.partition("\n")
        message = f"{head}\n\nthe rank's traceback:\n{rest.rstrip()}\n\nThe barrier stage failed.{retried}"
        error = RunError(message, None)
        error.rank = int(head.split()[1])  # type: ignore[attr-defined]
        return error
    lost = _FAILED_TASK.search(text)
    if lost:
        rank, reason = int(lost.group(1)), lost.group(2).strip()
        executor = _EXECUTOR.search(reason)
        where = f" (Spark executor {executor.group(1)})" if executor else ""
        error = RunError(
            f"rank {rank}{where} was lost: {reason}\n\nThe barrier stage of {n} ranks failed.{retried}", None
        )
        error.rank = rank  # type: ignore[attr-defined]
        return error
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return RunError(f"the Spark barrier stage of {n} ranks failed: {first}{retried}", None)
