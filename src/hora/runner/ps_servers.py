"""The parameter servers of ``hora run --num-ps S``: S processes beside the ranks, not ranks themselves.

Each runs ``python -m hora.ps --index I --workers N`` in a session of its own, with the ranks' job variables (the
store, the secret, the settings) and PR_SET_PDEATHSIG, its output prefixed ``[psI]``. They serve until the
workers are done: then :meth:`PsServers.stop` sends SIGTERM and, after the grace period, SIGKILL, and waits for
them, so nothing is left running. A server that dies while the workers run makes the workers fail (their errors
name it and its shards); the launcher says which server it was. With ``--max-restarts R`` the launcher starts it
again instead (``--generation g``: it restores its checkpoint and publishes its new address), up to R times per
server; past that it publishes the server as given up, so the workers waiting for it fail at once naming it. A
server stopped by a signal (SIGSTOP, state ``T`` in /proc) for :data:`FROZEN_AFTER` seconds is killed with SIGKILL
and handled as dead (restarted, or failing the workers within seconds instead of after their socket timeout).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from hora._proc import die_with_parent, kill_group
from hora.config import Config
from hora.errors import HoraError
from hora.ps.directory import open_store
from hora.runner.output import OutputPump

__all__ = ["FROZEN_AFTER", "PsServers", "report_exit"]

#: Seconds a server may stay stopped (SIGSTOP) while the workers run before the launcher kills it as dead.
FROZEN_AFTER = 2.0


def report_exit(index: int, pid: int, code: int, where: str = "") -> None:
    """Say that parameter server ``index`` ended while the workers still ran (``where``: " on host h")."""
    print(
        f"hora run: parameter server {index} (pid {pid}){where} exited with {code} while the workers were running",
        file=sys.stderr, flush=True,
    )  # fmt: skip


def _state(pid: int) -> str:
    """The process state letter from /proc (``R``, ``S``, ``T`` = stopped, ...); empty when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


class PsServers:
    """Start, watch, restart and stop the job's parameter-server processes on this machine.

    ``local``: the servers to start here, index -> environment on top of ``env`` (default: all ``count``); the
    others run on remote hosts, started by their hosts' agents (``--ps-per-host``), which do not restart them.
    """

    def __init__(
        self, count: int, workers: int, env: Mapping[str, str], pump: OutputPump, log: Callable[[str], None],
        max_restarts: int = 0, local: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:  # fmt: skip
        self.count = count
        self._local = {i: dict(e) for i, e in local.items()} if local is not None else {i: {} for i in range(count)}
        self.indices: list[int] = []  # the index of each of procs
        self._workers = workers
        self._env = dict(env)
        self._pump = pump
        self._log = log
        self.max_restarts = max_restarts
        self.restarts = dict.fromkeys(self._local, 0)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.on_start: Callable[[int], None] = lambda pid: None  # the launcher's reaper learns restarted pids
        self._cwd: str | None = None
        self._reported: set[int] = set()
        self._stopped_since: dict[int, float] = {}
        self._frozen: set[int] = set()  # servers the launcher killed for being stopped

    def start(self, cwd: str | None = None) -> list[int]:
        """Start every server of this machine; returns their pids (each the leader of its process group)."""
        self._cwd = cwd  # restarts run there too
        for i in self._local:
            self.procs.append(self._spawn(i, 0))
            self.indices.append(i)
        return [p.pid for p in self.procs]

    def _spawn(self, i: int, generation: int) -> subprocess.Popen[bytes]:
        """Start server ``i`` (``generation`` > 0: a restart, which restores its checkpoint first)."""
        argv = [sys.executable, "-m", "hora.ps", "--index", str(i), "--workers", str(self._workers)]
        if generation:
            argv += ["--generation", str(generation)]
        proc = subprocess.Popen(
            argv, env=self._server_env(i), cwd=self._cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        key = -1 - i - 1000 * generation  # a restart's output is a stream of its own: [ps0.restart1]
        self._pump.labels[key] = f"ps{i}.restart{generation}" if generation else f"ps{i}"
        self._pump.add(key, proc.stdout, proc.stderr)  # type: ignore[arg-type]
        if generation:
            self._log(f"restarted parameter server {i} as pid {proc.pid} (restart {generation})")
        else:
            self._log(f"started parameter server {i} as pid {proc.pid}")
        return proc

    def _server_env(self, i: int) -> dict[str, str]:
        return {**self._env, **self._local[i]}

    def check(self) -> None:
        """Restart (or report, once) a server that ended while the workers still run; kill a frozen one."""
        for j, (i, p) in enumerate(zip(self.indices, self.procs)):
            code = p.poll()
            if code is None:
                self._check_frozen(i, p)
                continue
            if i in self._reported:
                continue
            how = f"was stopped (SIGSTOP) for {FROZEN_AFTER:g}s and killed" if i in self._frozen else f"exited with {code}"
            self._frozen.discard(i)
            said = f"hora run: parameter server {i} (pid {p.pid}) {how} while the workers were running"
            if self.restarts[i] < self.max_restarts:
                self.restarts[i] += 1
                print(f"{said}; restarting it from its last checkpoint (restart {self.restarts[i]} of "
                      f"{self.max_restarts}, --max-restarts)", file=sys.stderr, flush=True)  # fmt: skip
                self.procs[j] = self._spawn(i, self.restarts[i])
                self.on_start(self.procs[j].pid)
                continue
            self._reported.add(i)
            reason = (
                f"hora run gave it up after {self.restarts[i]} restart(s) (--max-restarts {self.max_restarts})"
                if self.max_restarts else "the job runs without --max-restarts"
            )  # fmt: skip
            print(f"{said}; {reason}", file=sys.stderr, flush=True)
            if self.max_restarts:
                self._give_up(i, f"it {how} and {reason}")

    def _check_frozen(self, i: int, p: subprocess.Popen[bytes]) -> None:
        if _state(p.pid) not in ("T",):
            self._stopped_since.pop(i, None)
            return
        since = self._stopped_since.setdefault(i, time.monotonic())
        if time.monotonic() - since >= FROZEN_AFTER:
            self._stopped_since.pop(i, None)
            print(f"hora run: parameter server {i} (pid {p.pid}) is stopped (SIGSTOP?) and has not served for "
                  f"{FROZEN_AFTER:g}s: killing it (SIGKILL) so the workers do not wait for it", file=sys.stderr,
                  flush=True)  # fmt: skip
            self._frozen.add(i)
            kill_group(p.pid, signal.SIGKILL)

    def _give_up(self, i: int, reason: str) -> None:
        """Tell the workers waiting for server ``i``'s next restart that none comes (key ``<i>@<generation>``)."""
        try:
            config = Config.resolve(env=self._server_env(i))
            store, _ = open_store(config, -1 - i)
            try:
                store.set(f"{i}@{self.restarts[i] + 1}", json.dumps({"failed": reason}))
            finally:
                store.close()
        except HoraError as exc:  # the workers then fail when their wait for the restart times out
            self._log(f"could not tell the workers that parameter server {i} is given up: {exc}")

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
