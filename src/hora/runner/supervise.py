"""Watching the processes of a job: the local ranks (each in its own session), the job's bookkeeping of exits,
stop signals and failures, and a watcher that reports exits as they happen."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time

from hora._proc import kill_group
from hora.runner.hosts import RankSlot
from hora.runner.output import OutputPump
from hora.runner.remote_host import RemoteHost, RemoteRank
from hora.runner.result import Failure

__all__ = ["SETTLE", "ExitWatcher", "JobProcesses", "LocalRank"]

#: After the first failure, the others get this long to exit on their own before hora run stops them: the rank
#: that failed first may still be finishing its own exit while its peers already react to its departure.
SETTLE = 0.5


class LocalRank:
    """A rank started on this machine: the worker process, and its session."""

    reason = ""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        kill_group(self.pid, sig)  # the worker's own group: it and whatever it started

    def reaped(self) -> None:
        # Whatever is left of its process group goes too (a shell's children, say).
        self.signal(signal.SIGKILL)


class JobProcesses:
    """Every rank of one job (local or on a remote host), what each exited with, and the job's output pump."""

    def __init__(self, slots: list[RankSlot], pump: OutputPump, verbose: bool = False) -> None:
        self.slots = slots
        self.verbose = verbose
        n = len(slots)
        self.procs: list[LocalRank | RemoteRank] = []
        self.returncodes: list[int | None] = [None] * n
        self.sent: list[int | None] = [None] * n  # the last stopping signal hora run sent each rank
        self.failures: list[Failure] = []
        self.interrupted: int | None = None
        self.stopping_at: float | None = None
        self.first_failure_at: float | None = None
        self.pump = pump

    def log(self, message: str) -> None:
        if self.verbose:
            print(f"hora run: {message}", file=sys.stderr, flush=True)

    def signal_all(self, sig: int) -> None:
        remote: dict[RemoteHost, list[int]] = {}
        for i, p in enumerate(self.procs):
            if self.returncodes[i] is None:
                if sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
                    self.sent[i] = sig
                if isinstance(p, RemoteRank):
                    remote.setdefault(p.host, []).append(i)  # one message per host, not per rank
                else:
                    p.signal(sig)
        for host, ranks in remote.items():
            host.signal(sig, ranks)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()
            self.log(f"stopping the remaining ranks with {signal.Signals(sig).name}")
            self.signal_all(sig)

    def reap(self, order: list[int]) -> bool:
        """Collect exited workers, in the order they exited where known; True when all have exited."""
        now = time.monotonic()
        round_failures = []
        for i in order + [i for i in range(len(self.procs)) if i not in order]:
            p = self.procs[i]
            if self.returncodes[i] is not None:
                continue
            code = p.poll()
            if code is None:
                continue
            self.returncodes[i] = code
            p.reaped()
            self.log(f"rank {i} (pid {p.pid} on {self.slots[i].host}) exited with {code}")
            if code != 0:
                stopped = code < 0 and self.sent[i] is not None and -code in (self.sent[i], signal.SIGKILL)
                round_failures.append(
                    Failure(i, self.slots[i].host, p.pid, code, [], now, stopped and not p.reason, p.reason)
                )
        self.failures.extend(round_failures)
        if self.first_failure_at is None and any(not f.stopped for f in round_failures):
            self.first_failure_at = now
        return all(c is not None for c in self.returncodes)


class ExitWatcher:
    """Reports which workers exited, in exit order: one pidfd per worker (Linux >= 5.3), polling elsewhere."""

    def __init__(self, procs: dict[int, int]) -> None:
        """``procs``: rank -> pid of each local worker (remote ranks are reported by their host's agent)."""
        self._sel: selectors.BaseSelector | None = None
        if hasattr(os, "pidfd_open"):
            try:
                sel = selectors.DefaultSelector()
                for i, pid in procs.items():
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, i)
                self._sel = sel
            except OSError:
                self._sel = None

    def wait(self, timeout: float) -> list[int]:
        if self._sel is None:
            time.sleep(timeout)
            return []
        order = []
        for key, _ in self._sel.select(timeout):
            order.append(key.data)
            self._sel.unregister(key.fd)
            os.close(key.fd)
        return order

    def close(self) -> None:
        if self._sel is not None:
            for key in list(self._sel.get_map().values()):
                os.close(key.fd)
            self._sel.close()
