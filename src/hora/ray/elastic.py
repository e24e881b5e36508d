"""``ElasticRayExecutor``: an elastic job whose workers are Ray actors, with the calls of Horovod's
``horovod.ray.ElasticRayExecutor`` (``create_settings``, ``start``, ``run``).

The hosts are the Ray cluster's alive nodes (:class:`RayHostDiscovery`: a node's slots are its CPUs, and GPUs with
``use_gpu``, divided by the resources of one worker), polled every second as a discovery script would be; each slot
is served by one actor pinned to its node (``node:<ip>``), which sets the worker's environment in its own process and
calls the function — a script written for ``hvd.elastic.run`` — as one rank. Rounds, failures, blacklisting, the
reset limit and host changes are those of the elastic launcher (:mod:`hora.runner.elastic`). A worker whose function
raised, or whose actor died, is a failure (its node is blacklisted); the job ends when a worker's function returns.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hora.errors import ConfigError, RunError
from hora.ray import ray_logger
from hora.ray.worker import RankOutcome, RayWorker, WorkerState
from hora.runner.elastic.launch import ElasticSpec, launch_elastic
from hora.runner.elastic.workers import JobContext, Worker, elastic_env, wait_gone
from hora.runner.hosts import RankSlot

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayHostDiscovery"]


@dataclass
class ElasticRaySettings:
    """Horovod's ``ElasticSettings`` as ``ElasticRayExecutor.create_settings`` makes them (the SSH and NIC options
    do not apply to hora and are kept only so scripts run unchanged)."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600.0
    timeout_s: float = 30.0
    num_proc: int = 1
    discovery: Any = None  # set by the executor unless override_discovery=False
    cooldown_range: tuple[int, int] | None = None
    verbose: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class RayHostDiscovery:
    """The Ray cluster's alive nodes as hosts: slots = CPUs // ``cpus_per_slot`` (and GPUs // ``gpus_per_slot``
    with ``use_gpu``), as Horovod's ``RayHostDiscovery``."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: int = 1, gpus_per_slot: int = 1) -> None:
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot
        self.node_of: dict[str, str] = {}  # host name -> Ray node id

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        import ray

        nodes = []
        for node in ray.nodes():
            if not (node.get("Alive") or node.get("alive")):
                continue
            resources = node["Resources"]
            slots = resources.get("CPU", 0) // self.cpus_per_slot
            if self.use_gpu:
                slots = min(slots, resources.get("GPU", 0) // self.gpus_per_slot)
            if slots:
                nodes.append((node["NodeManagerAddress"], node["NodeID"], math.ceil(slots)))
        ips = [ip for ip, _, _ in nodes]
        hosts: dict[str, int] = {}
        for ip, node_id, slots in nodes:  # as RayExecutor names hosts: IP, or IP/node when nodes share an IP
            host = ip if ips.count(ip) == 1 else f"{ip}/{node_id[:12]}"
            self.node_of[host] = node_id
            hosts[host] = slots
        return hosts


class _ActorRank:
    """A worker that is a Ray actor running the function: its outcome is the exit code the launcher watches."""

    def __init__(self, actor: Any, ref: Any) -> None:
        self.actor, self.ref = actor, ref
        self.pid = 0  # not a process of this machine: never signalled by pid
        self.reason = ""
        self.outcome: RankOutcome | None = None
        self._code: int | None = None

    def poll(self) -> int | None:
        import ray

        if self._code is not None:
            return self._code
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            self.outcome = ray.get(self.ref)
            self._code = 0 if self.outcome.ok else 1
            if not self.outcome.ok:
                self.reason = f"{self.outcome.error_type}: {self.outcome.message}"
        except Exception as exc:  # the actor died (killed, its node lost)
            self._code, self.reason = -signal.SIGKILL, f"the actor died: {str(exc).strip().splitlines()[0]}"
        return self._code

    @property
    def tail(self) -> list[str]:
        """Why it failed, for the job's report (its output went to Ray's logs)."""
        return [self.reason] if self.reason else []

    def signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            import ray

            ray.kill(self.actor, no_restart=True)

    def reaped(self) -> None:
        """Nothing of it is left on this machine."""


class _ActorStarter:
    """Starts each slot's worker as an actor on the slot's node, running ``fn`` as that rank."""

    loss_detection = 0.0  # a dead actor's call fails at once

    def __init__(
        self,
        ctx: JobContext,
        fn: Callable[[], Any],
        env: dict[str, str],
        cpus: int,
        gpus: int,
        node_of: Callable[[str], str | None],
        queue: Any,
        log: Any,
    ) -> None:
        import ray

        self.ctx, self.fn, self.env, self.cpus, self.gpus, self.log = ctx, fn, env, cpus, gpus, log
        self.node_of, self.queue = node_of, queue
        self.actor_cls = ray.remote(RayWorker)
        self.workers: list[Worker] = []

    def start(self, slot: RankSlot, size: int, round_: int, index: int) -> Worker:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ip = slot.host.split("/")[0]
        env = elastic_env(self.ctx, slot, size, round_, self.env, ip, None)
        env["PYTHONUNBUFFERED"] = "1"
        node = self.node_of(slot.host)
        placement: dict[str, Any] = (
            {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
            if node
            else {"resources": {f"node:{ip}": 0.001}}
        )
        actor: Any = self.actor_cls.options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0, **placement
        ).remote()
        state = WorkerState(
            slot.rank, size, slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size, slot.host, ""
        )
        actor.setup.remote(env, state)
        if self.queue is not None:
            actor.set_queue.remote(self.queue)
        ref = actor.run.remote((self.fn, (), None))
        self.log(f"started worker {index} for {slot.host}:{slot.local_rank} (rank {slot.rank}) as a Ray actor")
        worker = Worker(index, slot, _ActorRank(actor, ref))
        self.workers.append(worker)
        return worker

    def end(self, worker: Worker, timeout: float) -> int | None:
        return worker.code if worker.code is not None else wait_gone(worker.proc, timeout)

    def close(self) -> None:
        """The actors are killed by then (end of the job)."""


class ElasticRayExecutor:
    """Run an elastic function on Ray actors (Horovod's ``horovod.ray.ElasticRayExecutor``).

    >>> settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4)
    >>> executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    >>> executor.start()
    >>> results = executor.run(train)     # train() calls hvd.init() and an @hvd.elastic.run function

    ``run`` returns the return values of the workers that finished, in rank order (as Horovod's).
    """

    @staticmethod
    def create_settings(
        min_num_proc: int = 1,
        max_num_proc: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float = 600,
        timeout_s: float = 30,
        ssh_identity_file: str | None = None,
        nics: Any = None,
        min_np: int | None = None,
        max_np: int | None = None,
        **kwargs: Any,
    ) -> ElasticRaySettings:
        """Horovod's settings factory (``min_np``/``max_np`` are its deprecated spellings)."""
        min_num_proc = min_np if min_np is not None else min_num_proc
        max_num_proc = max_np if max_np is not None else max_num_proc
        return ElasticRaySettings(
            min_num_proc,
            max_num_proc,
            reset_limit,
            float(elastic_timeout),
            float(timeout_s),
            min_num_proc,
            cooldown_range=kwargs.pop("cooldown_range", None),
            verbose=bool(kwargs.pop("verbose", False)),
            extra=dict(kwargs),
        )

    def __init__(
        self,
        settings: ElasticRaySettings,
        use_gpu: bool = False,
        cpus_per_slot: int = 1,
        gpus_per_slot: int | None = None,
        env_vars: dict[str, str] | None = None,
        override_discovery: bool = True,
    ) -> None:
        if gpus_per_slot and not use_gpu:
            raise ValueError(
                "gpus_per_slot is set, but use_gpu is False. use_gpu must be True if gpus_per_slot is set. "
            )
        gpus_per_slot = gpus_per_slot or int(use_gpu)
        if use_gpu and gpus_per_slot < 1:
            raise ValueError(f"gpus_per_slot must be >= 1: Got {gpus_per_slot}.")
        if override_discovery:
            settings.discovery = RayHostDiscovery(use_gpu, cpus_per_slot, gpus_per_slot)
        self.settings, self.use_gpu = settings, use_gpu
        self.cpus_per_slot, self.gpus_per_slot = cpus_per_slot, gpus_per_slot
        self.env_vars = dict(env_vars or {})
        self._started = False

    def start(self) -> None:
        """Connect to Ray (``ray.init()`` when not yet)."""
        import ray

        if not ray.is_initialized():
            ray.init()
        if self.settings.discovery is None:
            raise ConfigError("settings.discovery is None: pass override_discovery=True, or set a discovery")
        self._started = True

    def run(self, worker_fn: Callable[[], Any], callbacks: list[Callable[[Any], Any]] | None = None) -> list[Any]:
        """Run ``worker_fn()`` on every worker until one finishes; the finished workers' return values in rank
        order. Every callback is called on the driver with every value a worker sends with
        ``hora.ray.ray_logger.log`` (Horovod's).

        Raises:
            RunError: the job could not go on (reset limit, every worker failed, no slots in time); the report
                names the reason and the failed workers.
        """
        with ray_logger.Callbacks(callbacks) as queue:
            return self._run(worker_fn, queue)

    def _run(self, worker_fn: Callable[[], Any], queue: Any) -> list[Any]:
        import ray

        if not self._started:
            self.start()
        s = self.settings
        spec = ElasticSpec(
            [],
            np=s.num_proc,
            min_np=s.min_num_proc,
            max_np=s.max_num_proc,
            reset_limit=s.reset_limit,
            cooldown_range=s.cooldown_range,
            env={},
            settings={"elastic_timeout": s.elastic_timeout},
            verbose=s.verbose,
            start_timeout=s.timeout_s,
        )
        starters: list[_ActorStarter] = []

        def log(message: str) -> None:
            if s.verbose:
                print(f"hora.ray: {message}", flush=True)

        def starter(ctx: JobContext) -> _ActorStarter:
            node_of = getattr(s.discovery, "node_of", {})
            made = _ActorStarter(
                ctx, worker_fn, self.env_vars, self.cpus_per_slot, self.gpus_per_slot, node_of.get, queue, log
            )
            starters.append(made)
            return made

        result = launch_elastic(spec, s.discovery, ray.util.get_node_ip_address(), starter)
        if result.interrupted is not None:  # the workers are stopped: Ctrl-C (or SIGTERM) goes on to the caller
            signal.raise_signal(result.interrupted)
        if result.exit_code != 0:
            raise RunError(result.report() or f"the elastic job failed with exit code {result.exit_code}", result)
        done = [w for started in starters for w in started.workers if w.code == 0]
        outcomes = [(w.slot.rank, w.proc.outcome) for w in done if isinstance(w.proc, _ActorRank)]
        return [o.value for _, o in sorted(outcomes, key=lambda ro: ro[0]) if o is not None]
