"""What every task of :func:`hora.spark.run`'s barrier stage runs, inside a Spark executor's Python worker.

Task ``i`` is rank ``i``. The hosts come from Spark (``BarrierTaskContext.getTaskInfos()``: the executor of every
task), so ranks on one executor host share memory. Task 0 starts the job's rendezvous store in a thread of its
Python worker and tells the others where it listens through the barrier's ``allGather``; the secret came from the
driver inside the task's closure. Every task then writes its rank's environment into its process, runs the
function (``hora.init()`` in it works as under ``hora run``), shuts hora down and puts its environment back, since
Spark reuses the Python worker for later tasks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from hora.errors import PeerLostError, RunError, ShutdownError, StallError
from hora.runner.in_process import JobRendezvous, free_port, place, rank_env, run_as_rank, traceback_text

__all__ = ["CONSEQUENCE_DELAY", "FAILURE_BEGIN", "FAILURE_END", "RankTask"]

#: Markers around a rank's failure report inside Spark's error text, so the driver can find it.
FAILURE_BEGIN = "<<hora-rank-failure>>"
FAILURE_END = "<</hora-rank-failure>>"
#: Seconds a rank that only lost a peer (or was shut down) waits before failing its task. Spark aborts a barrier
#: stage at its first failed task and names that one: this lets the rank that caused it (its exception, its lost
#: executor) be the one named, as hora run's root cause would be.
CONSEQUENCE_DELAY = 3.0


class RankTask:
    """The barrier stage's task function (picklable: everything it needs travels with it)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        secret: bytes,
        job_id: str,
        env: Mapping[str, str],
        settings: Mapping[str, Any],
    ) -> None:
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs)
        self.secret, self.job_id = secret, job_id
        self.env, self.settings = dict(env), dict(settings)

    def __call__(self, _: Iterator[Any]) -> Iterator[tuple[int, Any]]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
        one_host = len(set(hosts)) == 1
        rendezvous = None
        try:
            if rank == 0:
                rendezvous = JobRendezvous("127.0.0.1" if one_host else hosts[0], self.secret, self.job_id)
                addr, port = rendezvous.start()
                master = ("127.0.0.1" if one_host else hosts[0], free_port())
                mine = json.dumps({"rendezvous": [addr, port], "master": list(master)})
            else:
                mine = ""
            found = json.loads(ctx.allGather(mine)[0])
            slots = place(hosts)
            env = rank_env(
                slots[rank],
                len(slots),
                (found["rendezvous"][0], int(found["rendezvous"][1])),
                self.secret,
                self.job_id,
                (found["master"][0], int(found["master"][1])),
                None if one_host else hosts[rank],
                self.env,
                self.settings,
            )
            try:
                value = run_as_rank(env, self.fn, self.args, self.kwargs)
            except Exception as exc:
                if isinstance(exc, (PeerLostError, ShutdownError, StallError)):
                    time.sleep(CONSEQUENCE_DELAY)
                report = f"rank {rank} on {hosts[rank]} raised {type(exc).__name__}: {exc}\n{traceback_text(exc)}"
                raise RunError(f"{FAILURE_BEGIN}{report}{FAILURE_END}", None) from None
            ctx.barrier()  # task 0 keeps the store until every rank is done with it
        finally:
            if rendezvous is not None:
                rendezvous.shutdown()
        yield rank, value
