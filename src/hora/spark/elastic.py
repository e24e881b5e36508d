"""``hora.spark.run_elastic``: an elastic job whose workers run in Spark tasks (Horovod's
``horovod.spark.run_elastic``).

The driver starts a Spark job of ``max_num_proc`` long-lived tasks (:class:`~hora.spark.task_service.TaskService`):
each registers at the driver's task registry and lends its slot for as long as the job lasts. The hosts of the
elastic job are the executors with registered, living tasks (:class:`SparkTaskDiscovery`: a host is
``<executor host>/exec-<id>``, its slots the tasks on it), so an executor that Spark loses takes only its own slots
away, and the task Spark starts again for it (on a new executor) comes back as a new host. Rounds, failures,
blacklisting, the reset limit and host changes are those of the elastic launcher (:mod:`hora.runner.elastic`); each
worker is the function run in a child process of a task (:class:`_TaskStarter`). The job ends when a worker's
function returns; the finished workers' return values come back in rank order.
"""

from __future__ import annotations

import base64
import json
import pickle
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousServer
from hora.config import Config
from hora.config.variables import read
from hora.errors import ConfigError, RunError
from hora.runner.elastic.launch import ElasticSpec, launch_elastic
from hora.runner.elastic.workers import JobContext, Worker, elastic_env, wait_gone
from hora.runner.hosts import RankSlot
from hora.spark.runner import DEFAULT_START_TIMEOUT, _context, _spark_text
from hora.spark.task_service import TaskService

__all__ = ["LOST_AFTER", "SparkTaskDiscovery", "run_elastic"]

#: A task whose beat has not changed for this long is lost (its executor died or hangs).
LOST_AFTER = 5.0
#: Seconds the tasks get to see that the job is done before the Spark job is cancelled.
END_WAIT = 10.0


class SparkTaskDiscovery:
    """The registered, living tasks as hosts: ``<executor host>/exec-<id>`` with one slot per task on it (Horovod's
    ``SparkDriverHostDiscovery``, per executor rather than per machine)."""

    def __init__(self, registry: RendezvousServer, prefix: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._registry, self._prefix, self._clock = registry, prefix, clock
        self._lock = threading.Lock()
        self._beats: dict[str, tuple[str, float]] = {}  # task -> (its last beat, when it changed)
        self.tasks: dict[str, dict[str, str]] = {}  # task -> what it registered (host, ip)

    def _look(self) -> dict[str, dict[str, str]]:
        """The living tasks now (the beats seen since the last look)."""
        now = self._clock()
        snap = self._registry.snapshot(self._prefix)
        cut = len(self._prefix)
        with self._lock:
            for k, v in snap.items():
                name = k[cut:]
                if name.startswith("task/") and name[5:] not in self.tasks:
                    self.tasks[name[5:]] = json.loads(v)
            for task in self.tasks:
                beat = snap.get(f"{self._prefix}beat/{task}", "")
                if self._beats.get(task, (None, 0.0))[0] != beat:
                    self._beats[task] = (beat, now)
            return {t: info for t, info in self.tasks.items() if now - self._beats[t][1] < LOST_AFTER}

    def alive(self, task: str) -> bool:
        return task in self._look()

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        hosts: dict[str, int] = {}
        for info in self._look().values():
            hosts[info["host"]] = hosts.get(info["host"], 0) + 1
        return hosts

    def idle_task(self, host: str, busy: set[str]) -> str | None:
        """A living task on ``host`` not running a worker (the one registered first)."""
        free = [t for t, info in self._look().items() if info["host"] == host and t not in busy]
        return min(free, key=lambda t: tuple(int(x) for x in t[1:].split("."))) if free else None


class _TaskRank:
    """A worker running in a task: its exit code comes from the task's report, or is SIGKILL's when the task is
    lost."""

    def __init__(self, task: str, index: int, registry: RendezvousServer, prefix: str, hosts: SparkTaskDiscovery):
        self.task, self.index, self._registry, self._prefix, self._hosts = task, index, registry, prefix, hosts
        self.pid = 0  # not a process of this machine: never signalled by pid
        self.tail: list[str] = []
        self._code: int | None = None
        self._signals = 0

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        raw = self._registry.snapshot(f"{self._prefix}exit/{self.index}").get(f"{self._prefix}exit/{self.index}")
        if raw is not None:
            report = json.loads(raw)
            self._code, self.tail = int(report["code"]), list(report["tail"])
        elif not self._hosts.alive(self.task):
            self._code = -signal.SIGKILL
            self.tail = [f"its Spark task {self.task} stopped answering: the executor was lost (or hangs)"]
        return self._code

    def signal(self, sig: int) -> None:
        self._signals += 1
        self._registry.put({f"{self._prefix}signal/{self.index}": f"{int(sig)}.{self._signals}"})

    def reaped(self) -> None:
        """Nothing of it is left on this machine."""


class _TaskStarter:
    """Starts each slot's worker in an idle task of the slot's executor."""

    loss_detection = LOST_AFTER + 1.0  # its tasks stop beating; host discovery (which drops it) runs every second

    def __init__(
        self,
        ctx: JobContext,
        registry: RendezvousServer,
        prefix: str,
        hosts: SparkTaskDiscovery,
        env: Mapping[str, str],
        log: Callable[[str], None],
    ) -> None:
        self.ctx, self.registry, self.prefix, self.hosts, self.env, self.log = ctx, registry, prefix, hosts, env, log
        self.workers: list[Worker] = []

    def start(self, slot: RankSlot, size: int, round_: int, index: int) -> Worker:
        busy = {w.proc.task for w in self.workers if w.code is None and isinstance(w.proc, _TaskRank)}
        task = self.hosts.idle_task(slot.host, busy)
        handle = _TaskRank(task or "", index, self.registry, self.prefix, self.hosts)
        if task is None:  # its executor was lost since the round was formed
            handle._code, handle.tail = -signal.SIGKILL, [f"no living Spark task on {slot.host} to run it"]
        else:
            env = elastic_env(self.ctx, slot, size, round_, self.env, self.hosts.tasks[task]["ip"], None)
            self.registry.put({f"{self.prefix}run/{task}": json.dumps({"index": index, "env": env})})
            self.log(f"started worker {index} for {slot.host}:{slot.local_rank} (rank {slot.rank}) in task {task}")
        worker = Worker(index, slot, handle)
        self.workers.append(worker)
        return worker

    def end(self, worker: Worker, timeout: float) -> int | None:
        return worker.code if worker.code is not None else wait_gone(worker.proc, timeout)

    def close(self) -> None:
        """The tasks stay until the job is done (see :func:`run_elastic`)."""


def _driver_address(sc: Any) -> str:
    """The address the executors reach the driver on (``spark.driver.host``, resolved)."""
    host = sc.getConf().get("spark.driver.host") or socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


def _start_timeout(start_timeout: float | None) -> float:
    if start_timeout is not None:
        return float(start_timeout)
    return float(read("HOROVOD_SPARK_START_TIMEOUT") or DEFAULT_START_TIMEOUT)


def run_elastic(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    start_timeout: float | None = None,
    elastic_timeout: float | None = None,
    reset_limit: int | None = None,
    env: Mapping[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    prefix_output_with_timestamp: bool = False,
    min_np: int | None = None,
    max_np: int | None = None,
    **settings: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` — a function that calls ``hvd.init()`` and an ``@hvd.elastic.run`` loop — as an
    elastic job on Spark tasks; return the finished workers' values in rank order.

    Args:
        num_proc: ranks to start with (default: the SparkContext's default parallelism, as Horovod).
        min_num_proc: fewest ranks the job goes on with (default ``num_proc``); ``min_np`` is its old spelling.
        max_num_proc: most ranks, and the number of Spark tasks started (default ``num_proc``); ``max_np`` is its
            old spelling.
        start_timeout: seconds for ``num_proc`` tasks to start and register (default ``HOROVOD_SPARK_START_TIMEOUT``,
            else 120).
        elastic_timeout: seconds to wait for ``min_num_proc`` slots after a change (default: the setting, 600).
        reset_limit: most resets before the job fails.
        env: extra environment variables of every worker.
        stdout, stderr, nics, prefix_output_with_timestamp: Horovod's; accepted and ignored (the workers' output
            goes to the executors' logs; a failed worker's last lines come back in the error).
        verbose: 0 silent, 1 (default) the job's changes, 2 every worker started.
        settings: hora settings for every worker.

    Raises:
        ConfigError: no active SparkContext, bad counts, or fewer than ``num_proc`` tasks within ``start_timeout``.
        RunError: the job could not go on (reset limit, every worker failed, too few slots in time); the report
            names the reason and the failed workers with the end of their output.
    """
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    sc = _context()
    n = int(num_proc or sc.defaultParallelism)
    low = n if min_num_proc is None else int(min_num_proc)
    high = n if max_num_proc is None else int(max_num_proc)
    if elastic_timeout is not None:
        settings = {**settings, "elastic_timeout": float(elastic_timeout)}
    config = Config.resolve(overrides=settings)
    secret, job_id = new_secret(), uuid.uuid4().hex[:16]
    prefix = f"{job_id}/tasks/"
    address = _driver_address(sc)
    registry = RendezvousServer(secret, host=address, max_frame_bytes=config.max_frame_bytes)
    registry.start()
    hosts = SparkTaskDiscovery(registry, prefix)
    from pyspark import cloudpickle  # what Spark ships functions with: lambdas and closures travel too

    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    service = TaskService(payload, registry.address, secret, prefix, dict(env or {}), config.max_frame_bytes)
    job = _SparkJob(sc, f"hora.spark.run_elastic.{job_id}", high, service)
    starters: list[_TaskStarter] = []

    def log(message: str) -> None:
        if verbose >= 2:
            print(f"hora.spark: {message}", flush=True)

    def starter(ctx: JobContext) -> _TaskStarter:
        made = _TaskStarter(ctx, registry, prefix, hosts, dict(env or {}), log)
        starters.append(made)
        return made

    try:
        job.start()
        _wait_for_tasks(hosts, n, _start_timeout(start_timeout), job)
        spec = ElasticSpec(
            [],
            np=n,
            min_np=low,
            max_np=high,
            reset_limit=reset_limit,
            env={},
            settings=settings,
            verbose=verbose >= 2,
        )
        result = launch_elastic(spec, hosts, address, starter)
    finally:
        registry.put({f"{prefix}done": "1"})
        job.finish(END_WAIT)
        values = registry.snapshot(f"{prefix}result/")
        registry.shutdown()
    if result.interrupted is not None:  # the workers are stopped: Ctrl-C (or SIGTERM) goes on to the caller
        signal.raise_signal(result.interrupted)
    if result.exit_code != 0:
        raise RunError(result.report() or f"the elastic job failed with exit code {result.exit_code}", result)
    done = [w for made in starters for w in made.workers if w.code == 0]
    outcomes = []
    for w in done:
        raw = values.get(f"{prefix}result/{w.index}")
        if raw is not None:
            got = json.loads(raw)
            outcomes.append((int(got["rank"]), pickle.loads(base64.b64decode(got["value"]))))
    return [value for _, value in sorted(outcomes, key=lambda rv: rv[0])]


def _wait_for_tasks(hosts: SparkTaskDiscovery, n: int, timeout: float, job: _SparkJob) -> None:
    deadline = time.monotonic() + timeout
    while (have := sum(hosts.find_available_hosts_and_slots().values())) < n:
        if job.error is not None:
            raise RunError(f"the Spark job of hora's tasks failed before they all started: {job.error}", None)
        if time.monotonic() > deadline:
            raise ConfigError(
                f"timed out waiting for Spark tasks to start: {have} of the {n} tasks registered within "
                f"{timeout:g}s. Each worker runs in a Spark task: check that the cluster has {n} free task slots, "
                "or raise start_timeout (HOROVOD_SPARK_START_TIMEOUT) if executors are allocated on demand."
            )
        time.sleep(0.1)


class _SparkJob:
    """The Spark job of the task services, run in a thread of its own (``collect`` blocks until every task ends)."""

    def __init__(self, sc: Any, group: str, n: int, service: TaskService) -> None:
        self.sc, self.group, self.n, self.service = sc, group, n, service
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="hora-spark-elastic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        self.sc.setJobGroup(self.group, f"hora.spark.run_elastic: up to {self.n} workers", interruptOnCancel=True)
        try:
            self.sc.parallelize(range(self.n), self.n).mapPartitions(self.service).collect()
        except Exception as exc:
            self.error = _spark_text(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

    def finish(self, wait: float) -> None:
        """Let the running tasks see that the job is done, then cancel the tasks Spark never started (they wait for
        a free slot) or that do not end within ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while self._thread.is_alive() and time.monotonic() < deadline and self._running_tasks():
            time.sleep(0.05)
        if self._thread.is_alive():
            self.sc.cancelJobGroup(self.group)
            self._thread.join(30.0)

    def _running_tasks(self) -> int:
        tracker = self.sc.statusTracker()
        running = 0
        for job in tracker.getJobIdsForGroup(self.group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else []:
                got = tracker.getStageInfo(stage)
                running += got.numActiveTasks if got else 0
        return running
