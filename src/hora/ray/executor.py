"""``RayExecutor``: hora ranks as Ray actors, with Horovod's ``horovod.ray.RayExecutor`` calls.

The driver (the process that creates the executor) reserves one placement-group bundle per worker (``PACK`` by
default, ``SPREAD`` across nodes when asked), starts one :class:`~hora.ray.worker.RayWorker` actor per bundle, asks
each where Ray put it, numbers the ranks host by host (so local ranks and hosts come from Ray's placement), hosts
the job's rendezvous store in a thread of its own, and hands every actor its rank's environment — the secret
included — as a Ray task argument. Functions then run in every actor; ``hora.init()`` in them works as under
``hora run``.

When a rank fails — it raised, or its actor died — the driver waits a moment for the other ranks' answers, names
the root cause (a dead actor or a rank's own exception before ranks that only lost a peer), kills every actor and
raises :class:`~hora.errors.RunError` with the rank, its host and its traceback. ``start()`` starts a fresh group.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hora.errors import ConfigError, RunError, UnsupportedError
from hora.ray import ray_logger
from hora.ray.worker import NodeInfo, RankOutcome, RayWorker, WorkerState
from hora.runner.in_process import JobRendezvous, place, rank_env
from hora.runner.result import Failure, RunResult

__all__ = ["RayExecutor", "RaySettings"]

log = logging.getLogger(__name__)

#: Seconds to wait for the other ranks' answers after the first failure, to tell the root cause from its effects.
SETTLE = 1.0
#: Longer, while every failure so far is only a consequence (a lost peer) and the cause has not reported yet.
SETTLE_FOR_CAUSE = 10.0


@dataclass(frozen=True)
class RaySettings:
    """Horovod's ``RayExecutor.create_settings()``: ``timeout_s`` bounds starting the workers and the rendezvous,
    ``placement_group_timeout_s`` how long Ray may take to find room for every worker."""

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0


class RayExecutor:
    """Run a function on ``num_workers`` hora ranks, each a Ray actor.

    >>> executor = RayExecutor(num_workers=2)
    >>> executor.start()
    >>> executor.run(train, args=(0.1,))      # every rank's return value, in rank order
    >>> executor.shutdown()

    Args:
        settings: :meth:`create_settings` (Horovod's first argument); default timeouts when None.
        num_workers: number of ranks.
        cpus_per_worker, use_gpu, gpus_per_worker: Ray resources of each worker (``gpus_per_worker`` defaults to 1
            with ``use_gpu``).
        env: extra environment variables of every rank (set in the actor before each call).
        placement_strategy: ``"PACK"`` (fill nodes in turn; ranks that share a node share memory) or
            ``"SPREAD"`` (across nodes), or Ray's ``"STRICT_PACK"`` / ``"STRICT_SPREAD"``.
        settings_overrides: hora settings for every rank (``transport="tcp"``, ``start_timeout=10`` ...).
    """

    def __init__(
        self,
        settings: RaySettings | None = None,
        num_workers: int | None = None,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        env: Mapping[str, str] | None = None,
        placement_strategy: str = "PACK",
        **settings_overrides: Any,
    ) -> None:
        if num_workers is None or num_workers < 1:
            raise ConfigError(f"num_workers must be at least 1, got {num_workers}")
        if placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ConfigError(
                f"placement_strategy={placement_strategy!r}; use PACK, SPREAD, STRICT_PACK or STRICT_SPREAD"
            )
        self.settings = settings or RaySettings()
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.env = dict(env or {})
        self.placement_strategy = placement_strategy
        self.hora_settings = settings_overrides
        self.workers: list[Any] = []  # actor handles, in rank order
        self.nodes: list[NodeInfo] = []  # where each rank runs
        self.states: list[WorkerState] = []
        self._group: Any = None
        self._rendezvous: JobRendezvous | None = None

    @staticmethod
    def create_settings(timeout_s: float = 30.0, placement_group_timeout_s: float = 100.0, **_: Any) -> RaySettings:
        """Horovod's settings factory (its SSH and NIC options do not apply to hora and are ignored)."""
        return RaySettings(timeout_s, placement_group_timeout_s)

    # -- life cycle ---------------------------------------------------------------------------------------------
    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
        extra_env_vars: Mapping[str, str] | None = None,
    ) -> None:
        """Start the workers (after stopping any left from before) and give each its rank.

        ``executable_cls`` is instantiated once in every worker, as in Horovod; :meth:`execute` passes the instance.

        Raises:
            ConfigError: Ray cannot place the workers within ``placement_group_timeout_s`` (too few CPUs/GPUs).
        """
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.shutdown()
        if not ray.is_initialized():
            ray.init()
        bundle = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker:
            bundle["GPU"] = float(self.gpus_per_worker)
        self._group = placement_group([dict(bundle) for _ in range(self.num_workers)], strategy=self.placement_strategy)
        try:
            ray.get(self._group.ready(), timeout=self.settings.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            available = ray.available_resources()
            self.shutdown()
            raise ConfigError(
                f"Ray could not place {self.num_workers} workers of {bundle} ({self.placement_strategy}) within "
                f"{self.settings.placement_group_timeout_s:g}s; the cluster has {available} free. Lower "
                "num_workers or cpus_per_worker/gpus_per_worker, or add nodes."
            ) from None
        actor_cls = ray.remote(RayWorker)
        actors: list[Any] = [
            actor_cls.options(
                num_cpus=self.cpus_per_worker,
                num_gpus=self.gpus_per_worker,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=i),
            ).remote()
            for i in range(self.num_workers)
        ]
        self.workers = actors
        infos: list[NodeInfo] = self._get([a.node.remote() for a in actors], "reporting where Ray placed them")
        order = _host_order(infos)
        self.workers = [actors[i] for i in order]
        self.nodes = [infos[i] for i in order]
        self._assign(dict(self.env, **(extra_env_vars or {})), executable_cls, executable_args, executable_kwargs)

    def _assign(
        self,
        env: dict[str, str],
        executable_cls: type | None,
        executable_args: Sequence[Any] | None,
        executable_kwargs: Mapping[str, Any] | None,
    ) -> None:
        import ray

        names = host_names(self.nodes)
        driver_ip = ray.util.get_node_ip_address()
        one_machine = len(set(names)) == 1 and self.nodes[0].ip == driver_ip
        self._rendezvous = JobRendezvous("127.0.0.1" if one_machine else driver_ip)
        rdv = self._rendezvous.start()
        slots = place(names)
        master = ("127.0.0.1" if one_machine else self.nodes[0].ip, self.nodes[0].port)
        calls = []
        self.states = []
        for slot, node, actor in zip(slots, self.nodes, self.workers):
            bind = None if one_machine else node.ip
            rank_vars = rank_env(
                slot,
                len(slots),
                rdv,
                self._rendezvous.secret,
                self._rendezvous.job_id,
                master,
                bind,
                env,
                self.hora_settings,
            )
            state = WorkerState(
                slot.rank,
                len(slots),
                slot.local_rank,
                slot.local_size,
                slot.cross_rank,
                slot.cross_size,
                slot.host,
                node.node_id,
            )
            self.states.append(state)
            calls.append(actor.setup.remote(rank_vars, state, executable_cls, executable_args or (), executable_kwargs))
        self._gather(calls, "setting up")

    def shutdown(self) -> None:
        """Stop every worker (hora is shut down in each, then the actor is killed) and free the placement group."""
        if not self.workers and self._group is None and self._rendezvous is None:
            return
        import ray

        if self.workers:
            try:
                ray.wait([w.stop.remote() for w in self.workers], num_returns=len(self.workers), timeout=5.0)
            except Exception:
                pass
        self._kill()

    def _kill(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:
                pass
        self.workers = []
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception:
                pass
            self._group = None
        if self._rendezvous is not None:
            self._rendezvous.shutdown()
            self._rendezvous = None

    # -- Horovod's calls ----------------------------------------------------------------------------------------
    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the values in rank order. Every callback is called on
        the driver with every value a rank sends with ``hora.ray.ray_logger.log`` while it runs.

        Raises:
            RunError: a rank raised or its actor died; the message names the rank, its host and the traceback.
        """
        import ray

        call = ray.put((fn, tuple(args), dict(kwargs or {})))
        with self._logging(callbacks) as workers:
            return self._gather([w.run.remote(call) for w in workers], "running the function")

    def execute(
        self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], Any]] | None = None
    ) -> list[Any]:
        """Run ``fn(executable)`` on every rank (``fn(state)``, a :class:`WorkerState`, without ``executable_cls``);
        ``callbacks`` as in :meth:`run`."""
        with self._logging(callbacks) as workers:
            return self._gather([w.execute.remote(fn) for w in workers], "executing the function")

    @contextlib.contextmanager
    def _logging(self, callbacks: Sequence[Callable[[Any], Any]] | None) -> Iterator[list[Any]]:
        """The started workers, sending what they log to ``callbacks`` for the length of the ``with``."""
        workers = self._started()
        with ray_logger.Callbacks(callbacks) as queue:
            if queue is None:
                yield workers
                return
            for w in workers:  # calls to an actor run in order: the queue is set before the function starts
                w.set_queue.remote(queue)
            try:
                yield workers
            finally:
                for w in workers:
                    w.set_queue.remote(None)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """:meth:`execute` on rank 0 only."""
        return self._gather([self._started()[0].execute.remote(fn)], "executing the function")[0]

    def run_remote(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
    ) -> list[Any]:
        """Start ``fn`` on every rank and return its Ray object refs at once (``ray.get`` them; a failed rank
        raises a ``RunError`` naming it). Failures are not handled for you: call :meth:`shutdown` after one.

        Raises:
            UnsupportedError: ``callbacks``: the call returns before the ranks log anything (use :meth:`run`).
        """
        import ray

        if callbacks:
            raise UnsupportedError(
                "RayExecutor.run_remote(callbacks=...) is not supported: it returns before the ranks log anything, "
                "so nothing would call the callbacks; use run(fn, callbacks=...) instead"
            )

        call = ray.put((fn, tuple(args), dict(kwargs or {})))
        return [w.run_remote.remote(call) for w in self._started()]

    def _started(self) -> list[Any]:
        if not self.workers:
            raise ConfigError("the RayExecutor is not started (or was stopped by a failure): call start() first")
        return self.workers

    # -- gathering answers, failures --------------------------------------------------------------------------
    def _get(self, refs: list[Any], what: str) -> list[Any]:
        import ray

        try:
            return list(ray.get(refs, timeout=self.settings.timeout_s))
        except ray.exceptions.GetTimeoutError:
            self._kill()
            raise RunError(f"the Ray workers did not answer within {self.settings.timeout_s:g}s {what}", None) from None
        except ray.exceptions.RayError as exc:
            self._kill()
            raise RunError(f"a Ray worker failed {what}: {exc}", None) from exc

    def _gather(self, refs: list[Any], what: str) -> list[Any]:
        """Every rank's value; on the first failure wait :data:`SETTLE`, stop every worker and raise the root cause."""
        import ray

        rank_of = {ref: i for i, ref in enumerate(refs)}
        values: dict[int, Any] = {}
        failures: list[RankOutcome] = []
        first = None
        pending = list(refs)
        try:
            while pending:
                if first is not None:
                    settle = SETTLE_FOR_CAUSE if all(f.consequence for f in failures) else SETTLE
                    if time.monotonic() - first > settle:
                        break
                ready, pending = ray.wait(pending, num_returns=1, timeout=0.2)
                for ref in ready:
                    outcome = self._answer(ref, rank_of[ref])
                    if outcome.ok:
                        values[outcome.rank] = outcome.value
                    else:
                        failures.append(outcome)
                        first = first or time.monotonic()
        except KeyboardInterrupt:  # Ctrl-C in the driver: the workers stop now, not when the driver exits
            self._kill()
            raise
        if failures:
            self._kill()
            raise _failure_error(failures, self.states, self.nodes, what)
        return [values[i] for i in range(len(refs))]

    def _answer(self, ref: Any, index: int) -> RankOutcome:
        import ray

        rank = self.states[index].rank if index < len(self.states) else index
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return RankOutcome(rank, False, error_type="the Ray actor died", message=_first_line(exc))
        except ray.exceptions.RayError as exc:
            return RankOutcome(rank, False, error_type=type(exc).__name__, message=_first_line(exc), traceback=str(exc))
        if not isinstance(outcome, RankOutcome):
            return RankOutcome(rank, True, outcome)
        return outcome


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "hora.ray needs Ray: pip install -c constraints.txt -e '.[ray]' in hora's checkout (Ray 2.60)"
        ) from None
    return ray


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _host_order(infos: list[NodeInfo]) -> list[int]:
    """Bundle indices in rank order: node by node (in order of the node's first bundle), bundle order within."""
    nodes = list(dict.fromkeys(i.node_id for i in infos))
    return sorted(range(len(infos)), key=lambda i: (nodes.index(infos[i].node_id), i))


def host_names(nodes: Sequence[NodeInfo]) -> list[str]:
    """hora's host name of each rank: its node's IP, or IP/node id when several Ray nodes share one IP (nodes
    started on one machine), so that only ranks of one Ray node share memory."""
    ids_of_ip: dict[str, set[str]] = {}
    for n in nodes:
        ids_of_ip.setdefault(n.ip, set()).add(n.node_id)
    return [n.ip if len(ids_of_ip[n.ip]) == 1 else f"{n.ip}/{n.node_id[:12]}" for n in nodes]


def _failure_error(
    failures: list[RankOutcome], states: list[WorkerState], nodes: list[NodeInfo], what: str
) -> RunError:
    """RunError for the root cause: a dead actor or a rank's own error before ranks that only lost a peer."""
    causes = [f for f in failures if not f.consequence] or failures
    died = [f for f in causes if f.error_type == "the Ray actor died"]
    root = (died or causes)[0]
    host = states[root.rank].host if 0 <= root.rank < len(states) else "?"
    pid = nodes[root.rank].pid if 0 <= root.rank < len(nodes) else 0
    if died and root is died[0]:
        head = f"rank {root.rank} on {host} (pid {pid}): the Ray actor died while {what}: {root.message}"
    else:
        head = f"rank {root.rank} on {host} (pid {pid}) raised {root.error_type} while {what}: {root.message}"
    others = sorted({f.rank for f in failures} - {root.rank})
    lines = [head]
    if root.traceback:
        lines += ["", f"rank {root.rank}'s traceback:", root.traceback.rstrip()]
    if others:
        after = "; ".join(
            f"rank {f.rank}: {f.error_type}: {f.message}" for f in failures if f.rank != root.rank
        )
        lines += ["", f"ranks {others} failed too (after it): {after}"]
    lines.append("The executor's workers were stopped; call start() to run again.")
    result = RunResult(
        1,
        [None] * len(states),
        Failure(root.rank, host, pid, -9 if died else 1, root.traceback.splitlines()[-20:], time.time()),
        [
            Failure(f.rank, states[f.rank].host if 0 <= f.rank < len(states) else "?", 0, 1, [], time.time())
            for f in failures
        ],
    )
    error = RunError("\n".join(lines), result)
    error.rank = root.rank  # type: ignore[attr-defined]
    if root.exception is not None:
        error.__cause__ = root.exception
    return error
