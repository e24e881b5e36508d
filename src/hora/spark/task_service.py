"""What every task of :func:`hora.spark.run_elastic`'s Spark job runs, inside a Spark executor's Python worker: a
task service that lends its slot to the elastic driver for as long as the job lasts.

The task registers at the driver's task registry (an authenticated rendezvous store, :mod:`hora._runtime.rendezvous`)
with its executor, beats every :data:`BEAT_SECONDS` so the driver sees it alive, and waits for orders. An order to
run a worker starts the function in a child process (``python -m hora.runner.function_worker``, the worker's
elastic environment written into it, dying with the task through ``PR_SET_PDEATHSIG``); the task forwards the
signals the driver asks for to the child's process group and, when the child exits, reports its exit code, the end
of its output and, on success, its pickled return value. The task ends when the driver says the job is done (or its
registry is gone). A task can run several workers one after the other (its executor can come back from the
blacklist); it never runs two at once.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hora._proc import die_with_parent, parent_pid
from hora._runtime.rendezvous import RendezvousClient
from hora.config.variables import environment, read
from hora.errors import RendezvousError

__all__ = ["BEAT_SECONDS", "TAIL_LINES", "TaskService", "executor_of_this_worker"]

#: How often a task tells the driver it is alive.
BEAT_SECONDS = 0.5
#: How often a task looks for orders and for its worker's exit.
POLL_SECONDS = 0.05
#: Lines of a failed worker's output sent to the driver for its report.
TAIL_LINES = 40


def executor_of_this_worker() -> tuple[str, str]:
    """(executor id, executor host) of the Spark executor above this Python worker, read from the executor JVM's
    command line (``CoarseGrainedExecutorBackend --executor-id N --hostname H``); ``("driver", this host's name)``
    in local mode, where the driver's JVM runs the tasks."""
    pid = os.getppid()
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(a.endswith(b"CoarseGrainedExecutorBackend") for a in argv):
                opts = dict(itertools.pairwise(argv))
                executor = opts.get(b"--executor-id", b"?").decode()
                return executor, opts.get(b"--hostname", socket.gethostname().encode()).decode()
            pid = parent_pid(pid)
        except OSError:
            break
    return "driver", socket.gethostname()


def _address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (what a peer that reaches ``host`` reaches us on)."""
    if host.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the route
        return str(s.getsockname()[0])


class TaskService:
    """The Spark job's task function (picklable: everything it needs travels with it)."""

    def __init__(
        self,
        payload: bytes,
        registry: tuple[str, int],
        secret: bytes,
        prefix: str,
        env: Mapping[str, str],
        max_frame_bytes: int,
    ) -> None:
        self.payload = payload  # the pickled (fn, args, kwargs)
        self.registry, self.secret, self.prefix = registry, secret, prefix
        self.env, self.max_frame = dict(env), max_frame_bytes

    def __call__(self, _: Iterator[Any]) -> Iterator[int]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "TaskService runs inside a Spark task"
        key = f"t{ctx.partitionId()}.{ctx.attemptNumber()}"
        executor, host = executor_of_this_worker()
        store = RendezvousClient(
            self.registry[0],
            self.registry[1],
            self.secret,
            ctx.partitionId(),
            self.prefix,
            time.monotonic() + 60.0,
            self.max_frame,
        )
        # in Spark's local directory, which Spark removes with the application even when this task is killed
        local = (read("SPARK_LOCAL_DIRS") or "").split(",")[0]
        workdir = tempfile.mkdtemp(prefix="hora-spark-task-", dir=local if os.path.isdir(local) else None)
        runs = 0
        try:
            store.set(
                f"task/{key}",
                json.dumps({"host": f"{host}/exec-{executor}", "ip": _address_towards(self.registry[0])}),
            )
            runs = _Service(store, key, workdir, self.payload, self.env, self.max_frame).serve()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            store.close()
        yield runs


class _Service:
    def __init__(
        self, store: RendezvousClient, key: str, workdir: str, payload: bytes, env: dict[str, str], max_frame: int
    ) -> None:
        self.store, self.key, self.workdir, self.payload, self.env = store, key, workdir, payload, env
        self.max_frame = max_frame
        self.child: subprocess.Popen[bytes] | None = None
        self.index: int | None = None  # the worker the child runs
        self.signalled: str | None = None
        self.done: set[int] = set()

    def serve(self) -> int:
        """Run the driver's orders until the job is done; how many workers this task ran."""
        beat = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= beat:
                    self.store.add(f"beat/{self.key}")
                    beat = now + BEAT_SECONDS
                if self.store.get("done") is not None:
                    return len(self.done)
                if self.child is None:
                    self._take_order()
                else:
                    self._forward_signal()
                    if (code := self.child.poll()) is not None:
                        self._report(code)
                time.sleep(POLL_SECONDS)
        except RendezvousError:
            return len(self.done)  # the driver is gone: nothing is waiting for this task any more
        finally:
            if self.child is not None and self.child.poll() is None:
                os.killpg(self.child.pid, signal.SIGKILL)
                self.child.wait()

    def _take_order(self) -> None:
        raw = self.store.get(f"run/{self.key}")
        if raw is None:
            return
        order = json.loads(raw)
        index = int(order["index"])
        if index in self.done:
            return
        run = Path(self.workdir) / str(index)
        run.mkdir()
        (run / "fn.pkl").write_bytes(self.payload)
        path = [p for p in sys.path if p]
        env = {**environment(), **self.env, **order["env"], "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*path, *env.get("PYTHONPATH", "").split(os.pathsep)]))
        with open(run / "output", "wb") as output:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "hora.runner.function_worker", str(run)],
                env={k: v for k, v in env.items() if v is not None},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.index, self.signalled = index, None

    def _forward_signal(self) -> None:
        assert self.child is not None and self.index is not None
        sig = self.store.get(f"signal/{self.index}")
        if sig is not None and sig != self.signalled:
            self.signalled = sig
            try:
                os.killpg(self.child.pid, int(sig.split(".")[0]))
            except ProcessLookupError:
                pass

    def _report(self, code: int) -> None:
        """The child exited: its output goes to this executor's log, its value and exit code to the driver."""
        assert self.index is not None
        run = Path(self.workdir) / str(self.index)
        output = (run / "output").read_bytes().decode(errors="replace")
        sys.stderr.write(output)
        sys.stderr.flush()
        tail = output.splitlines()[-TAIL_LINES:]
        results = sorted(run.glob("result.*.pkl"))
        if code == 0 and results:
            value = base64.b64encode(results[0].read_bytes()).decode()
            rank = int(results[0].name.split(".")[1])
            if len(value) > self.max_frame - 4096:
                code, tail = 1, [
                    f"the function's return value is {len(value)} bytes pickled and base64-encoded, more than the "
                    f"largest frame the driver accepts ({self.max_frame}, setting max_frame_bytes): return less "
                    "(write large results to files) or raise HORA_MAX_FRAME_BYTES"
                ]
            else:
                self.store.set(f"result/{self.index}", json.dumps({"rank": rank, "value": value}))
        self.store.set(f"exit/{self.index}", json.dumps({"code": code, "tail": tail}))
        self.done.add(self.index)
        shutil.rmtree(run, ignore_errors=True)
        self.child, self.index = None, None
