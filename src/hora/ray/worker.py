"""The Ray actor that is one rank of a :class:`~hora.ray.RayExecutor` (made a Ray actor class by the executor).

Everything here runs inside the actor's process. The executor first asks each actor where Ray placed it
(:meth:`RayWorker.node`), then hands it its rank's environment (:meth:`RayWorker.setup`, the secret included, as a
Ray task argument), and then runs functions in it. A function that raises does not raise out of the actor: the
actor answers with a :class:`RankOutcome` naming its rank and carrying the traceback, so the driver can pick the
root cause among the ranks and stop the others.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hora.errors import PeerLostError, RunError, ShutdownError, StallError
from hora.ray import ray_logger
from hora.runner.in_process import free_port, run_as_rank, traceback_text

__all__ = ["NodeInfo", "RankOutcome", "RayWorker", "WorkerState"]

#: Errors a rank raises because another rank failed first: never the root cause when something else failed.
CONSEQUENCES = (PeerLostError, ShutdownError, StallError)


@dataclass(frozen=True)
class NodeInfo:
    """Where Ray placed an actor."""

    node_id: str
    ip: str
    hostname: str
    pid: int
    port: int  # a free port there, for torch.distributed's MASTER_PORT when this actor becomes rank 0


@dataclass
class WorkerState:
    """What :meth:`RayExecutor.execute` passes to its function when no ``executable_cls`` was given: the rank's
    place, and a ``data`` dict that lives as long as the worker (keep a model or a dataset there between calls)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str
    node_id: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankOutcome:
    """One rank's answer: its value, or what it raised (type, message, traceback, and the exception itself when it
    can be pickled)."""

    rank: int
    ok: bool
    value: Any = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    consequence: bool = False  # raised because another rank failed (peer lost, shutdown, stall)
    exception: BaseException | None = None


class RayWorker:
    """One rank. Plain class; :class:`~hora.ray.RayExecutor` turns it into a Ray actor class."""

    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.state: WorkerState | None = None
        self.executable: Any = None

    def node(self) -> NodeInfo:
        import ray

        ip = ray.util.get_node_ip_address()
        return NodeInfo(ray.get_runtime_context().get_node_id(), ip, socket.gethostname(), os.getpid(), free_port(ip))

    def setup(
        self,
        env: Mapping[str, str],
        state: WorkerState,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] = (),
        executable_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.env, self.state = dict(env), state
        if executable_cls is not None:
            self.executable = self._call(executable_cls, executable_args, executable_kwargs)

    def _call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> Any:
        # keep: the actor is this rank for the executor's life, so hora stays initialised between calls
        return run_as_rank(self.env, fn, args, kwargs, keep=True)

    def run(self, call: tuple[Callable[..., Any], Sequence[Any], Mapping[str, Any] | None]) -> RankOutcome:
        """``fn(*args, **kwargs)``; what it raised comes back as a failed :class:`RankOutcome`."""
        fn, args, kwargs = call
        return self._outcome(lambda: self._call(fn, args, kwargs))

    def execute(self, fn: Callable[[Any], Any]) -> RankOutcome:
        """``fn(executable)`` (an instance of ``executable_cls``), or ``fn(state)`` without one."""
        target = self.executable if self.executable is not None else self.state
        return self._outcome(lambda: self._call(fn, (target,), None))

    def run_remote(self, call: tuple[Callable[..., Any], Sequence[Any], Mapping[str, Any] | None]) -> Any:
        """``fn(*args, **kwargs)`` for :meth:`RayExecutor.run_remote`: raises :class:`RunError` naming the rank."""
        outcome = self.run(call)
        if not outcome.ok:
            raise RunError(_describe(outcome, self.state), None) from outcome.exception
        return outcome.value

    def set_queue(self, queue: Any) -> None:
        """Where ``hora.ray.ray_logger.log`` sends values from this worker (None: nowhere), for the executor's
        ``callbacks``."""
        ray_logger.configure(queue)

    def stop(self) -> None:
        """Leave the group cleanly (the executor kills the actor right after)."""
        import hora

        hora.shutdown()

    def _outcome(self, call: Callable[[], Any]) -> RankOutcome:
        rank = self.state.rank if self.state else -1
        try:
            return RankOutcome(rank, True, call())
        except Exception as exc:
            outcome = RankOutcome(
                rank,
                False,
                error_type=type(exc).__name__,
                message=str(exc),
                traceback=traceback_text(exc),
                consequence=isinstance(exc, CONSEQUENCES),
                exception=exc,
            )
            return outcome if _picklable(exc) else _without_exception(outcome)


def _picklable(exc: BaseException) -> bool:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return True
    except Exception:
        return False


def _without_exception(outcome: RankOutcome) -> RankOutcome:
    outcome.exception = None
    return outcome


def _describe(outcome: RankOutcome, state: WorkerState | None) -> str:
    where = f" on {state.host}" if state else ""
    return (
        f"rank {outcome.rank}{where} (pid {os.getpid()}) raised {outcome.error_type}: {outcome.message}\n"
        f"{outcome.traceback}"
    )
