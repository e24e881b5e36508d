"""The parameter servers of ``hora run --num-ps S``: S processes beside the ranks, not ranks themselves.

Each runs ``python -m hora.ps --index I --workers N`` in a session of its own, with the ranks' job variables (the
store, the secret, the settings) and PR_SET_PDEATHSIG, its output prefixed ``[psI]``. They serve until the
workers are done: then :meth:`PsServers.stop` sends SIGTERM and, after the grace period, SIGKILL, and waits for
them, so nothing is left running. A server that dies while the workers run makes the workers fail (their errors
name it and its shards); the launcher says which server it was.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from hora._proc import die_with_parent, kill_group
from hora.runner.output import OutputPump

__all__ = ["PsServers", "report_exit"]


def report_exit(index: int, pid: int, code: int, where: str = "") -> None:
    """Say that parameter server ``index`` ended while the workers still ran (``where``: " on host h")."""
    print(
        f"hora run: parameter server {index} (pid {pid}){where} exited with {code} while the workers were running",
        file=sys.stderr, flush=True,
    )  # fmt: skip


class PsServers:
    """Start, watch and stop the job's parameter-server processes on this machine.

    ``local``: the servers to start here, index -> environment on top of ``env`` (default: all ``count``); the
    others run on remote hosts, started by their hosts' agents (``--ps-per-host``).
    """

    def __init__(
        self, count: int, workers: int, env: Mapping[str, str], pump: OutputPump, log: Callable[[str], None],
        local: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:  # fmt: skip
        self.count = count
        self._local = {i: dict(e) for i, e in local.items()} if local is not None else {i: {} for i in range(count)}
        self.indices: list[int] = []  # the index of each of procs
        self._workers = workers
        self._env = dict(env)
        self._pump = pump
        self._log = log
        self.procs: list[subprocess.Popen[bytes]] = []
        self._reported: set[int] = set()

    def start(self, cwd: str | None = None) -> list[int]:
        """Start every server; returns their pids (each the leader of its process group)."""
        for i, extra in self._local.items():
            argv = [sys.executable, "-m", "hora.ps", "--index", str(i), "--workers", str(self._workers)]
            proc = subprocess.Popen(
                argv, env={**self._env, **extra}, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
            self._pump.labels[-1 - i] = f"ps{i}"
            self._pump.add(-1 - i, proc.stdout, proc.stderr)  # type: ignore[arg-type]
            self._log(f"started parameter server {i} as pid {proc.pid}")
            self.procs.append(proc)
            self.indices.append(i)
        return [p.pid for p in self.procs]

    def check(self) -> None:
        """Say (once) when a server ended while the workers still run."""
        for i, p in zip(self.indices, self.procs):
            code = p.poll()
            if code is not None and i not in self._reported:
                self._reported.add(i)
                report_exit(i, p.pid, code)

    def stop(self, grace: float) -> None:
        """SIGTERM every server, SIGKILL what is left after ``grace`` seconds, and reap them all."""
        for p in self.procs:
            if p.poll() is None:
                kill_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            kill_group(p.pid, signal.SIGKILL)  # whatever is left of its group
            try:
                p.wait(10.0)
            except subprocess.TimeoutExpired:  # unkillable (D state): report it rather than hang
                print(f"hora run: parameter server pid {p.pid} did not exit after SIGKILL", file=sys.stderr)
