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
:class:`RestartBudget` holds that policy; a remote host's agent (:mod:`hora.runner.host_agent`) applies it to the
servers it starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping

from hora._proc import die_with_parent, kill_group
from hora.config import Config
from hora.errors import ConfigError, HoraError
from hora.ps.directory import open_store
from hora.runner.output import OutputPump
from hora.runner.result import Failure

__all__ = ["FROZEN_AFTER", "PsServers", "report_exit"]

#: Seconds a server may stay stopped (SIGSTOP) while the workers run before the launcher kills it as dead.
FROZEN_AFTER = 2.0


def report_exit(index: int, pid: int, code: int, where: str = "") -> None:
    """Say that parameter server ``index`` ended while the workers still ran (``where``: " on host h")."""
    print(
        f"hora run: parameter server {index} (pid {pid}){where} exited with {code} while the workers were running",
        file=sys.stderr,
        flush=True,
    )


def server_key(index: int, generation: int = 0) -> int:
    """The output key of server ``index`` (of its restart ``generation``): negative, so never a rank's."""
    return -1 - index - 1000 * generation


def server_of(key: int) -> tuple[int, int]:
    """The server index and generation of an output key made by :func:`server_key`."""
    return (-1 - key) % 1000, (-1 - key) // 1000


def server_label(index: int, generation: int) -> str:
    """How a server's output is prefixed: ``ps0``, and ``ps0.restart1`` for its first restart."""
    return f"ps{index}.restart{generation}" if generation else f"ps{index}"


def server_argv(index: int, workers: int, generation: int = 0) -> list[str]:
    """The command line of server ``index`` (``generation`` > 0: a restart, which restores its checkpoint)."""
    argv = [sys.executable, "-m", "hora.ps", "--index", str(index), "--workers", str(workers)]
    return [*argv, "--generation", str(generation)] if generation else argv


def restarting(generation: int, max_restarts: int) -> str:
    return f"restarting it from its last checkpoint (restart {generation} of {max_restarts}, --max-restarts)"


def _state(pid: int) -> str:
    """The process state letter from /proc (``R``, ``S``, ``T`` = stopped, ...); empty when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


class RestartBudget:
    """What happens to a server that ended while the workers ran: restarted up to ``max_restarts`` times (each
    restart a new generation), else given up. A server stopped (SIGSTOP, state ``T``) for :data:`FROZEN_AFTER`
    seconds is killed first (:meth:`watch`), and its end is then told as such. Used by the launcher for the servers
    of its own machine and by each remote host's agent for that host's."""

    def __init__(self, max_restarts: int, indices: Iterable[int]) -> None:
        self.max_restarts = max_restarts
        self.restarts = dict.fromkeys(indices, 0)
        self._stopped_since: dict[int, float] = {}
        self._frozen: set[int] = set()  # servers killed for being stopped

    def watch(self, index: int, pid: int) -> None:
        """Kill server ``index`` (alive, ``pid``) when it has been stopped for :data:`FROZEN_AFTER` seconds."""
        if _state(pid) != "T":
            self._stopped_since.pop(index, None)
            return
        since = self._stopped_since.setdefault(index, time.monotonic())
        if time.monotonic() - since >= FROZEN_AFTER:
            self._stopped_since.pop(index, None)
            print(
                f"hora run: parameter server {index} (pid {pid}) is stopped (SIGSTOP?) and has not served for "
                f"{FROZEN_AFTER:g}s: killing it (SIGKILL) so the workers do not wait for it",
                file=sys.stderr,
                flush=True,
            )
            self._frozen.add(index)
            kill_group(pid, signal.SIGKILL)

    def how(self, index: int, code: int) -> str:
        """How server ``index`` ended (once per end: "exited with -9", or killed as frozen)."""
        if index in self._frozen:
            self._frozen.discard(index)
            return f"was stopped (SIGSTOP) for {FROZEN_AFTER:g}s and killed"
        return f"exited with {code}"

    def next_generation(self, index: int) -> int | None:
        """The generation to restart server ``index`` as, counted against the budget; None: give it up."""
        if self.restarts[index] >= self.max_restarts:
            return None
        self.restarts[index] += 1
        return self.restarts[index]

    def given_up(self, index: int) -> str:
        """Why server ``index`` is not restarted again."""
        if not self.max_restarts:
            return "the job runs without --max-restarts"
        return f"hora run gave it up after {self.restarts[index]} restart(s) (--max-restarts {self.max_restarts})"

    def ended(
        self, index: int, code: int, env: Mapping[str, str], log: Callable[[str], None]
    ) -> tuple[str, int | None, str]:
        """Server ``index`` ended with ``code``: how it ended, the generation to restart it as (None: not
        restarted) and why not. A server given up under ``--max-restarts`` is published as such at the job's store
        (``env``: the server's), so the workers waiting for its restart fail at once; ``log`` hears if that fails."""
        how, generation = self.how(index, code), self.next_generation(index)
        if generation is not None:
            return how, generation, ""
        reason = self.given_up(index)
        if self.max_restarts:
            # the workers wait for the next generation, or for the last restart if it died before it was up (a
            # checkpoint it could not restore, say): both are told at once, not after their wait times out
            generations = [g for g in (self.restarts[index], self.restarts[index] + 1) if g > 0]
            failed = give_up(env, index, generations, f"it {how} and {reason}")
            if failed:
                log(failed)
        return how, None, reason


def check_checkpoint_dir(directory: str) -> None:
    """``--ps-checkpoint-dir`` must be a directory this user can create and write."""
    try:
        os.makedirs(directory, exist_ok=True)
        problem = "" if os.access(directory, os.W_OK | os.X_OK) else "it is not writable"
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem:
        raise ConfigError(
            f"--ps-checkpoint-dir {directory} cannot be used ({problem}): the parameter servers save their shards "
            "there; choose a directory you can write"
        )


def server_failure(index: int, key: int, host: str, pid: int, code: int, tail: list[str]) -> Failure:
    """Server ``index`` ended while the workers ran and is not restarted: a failure that can be the job's root cause
    (the workers' errors that follow name it)."""
    return Failure(key, host, pid, code, tail, time.monotonic(), label=f"parameter server {index}")


def give_up(env: Mapping[str, str], index: int, generations: Iterable[int], reason: str) -> str | None:
    """Tell the workers waiting for server ``index``'s restart of one of ``generations`` that none comes (the store
    keys ``<index>@<generation>`` not published yet, :mod:`hora.ps.reconnect`); ``env``: the server's. Returns why
    that failed, or None."""
    try:
        store, _ = open_store(Config.resolve(env=env), -1 - index)
        try:
            for generation in generations:
                if store.get(f"{index}@{generation}") is None:  # a restart that came up keeps its address
                    store.set(f"{index}@{generation}", json.dumps({"failed": reason}))
        finally:
            store.close()
    except HoraError as exc:  # the workers then fail when their wait for the restart times out
        return f"could not tell the workers that parameter server {index} is given up: {exc}"
    return None


class PsServers:
    """Start, watch, restart and stop the job's parameter-server processes on this machine.

    ``local``: the servers to start here, index -> environment on top of ``env`` (default: all ``count``); the
    others run on remote hosts, started (and restarted) by their hosts' agents (``--ps-per-host``).
    """

    def __init__(
        self,
        count: int,
        workers: int,
        env: Mapping[str, str],
        pump: OutputPump,
        log: Callable[[str], None],
        max_restarts: int = 0,
        local: Mapping[int, Mapping[str, str]] | None = None,
        merge_stderr: bool = False,
    ) -> None:
        self.count = count
        self._merge_stderr = merge_stderr
        self._local = {i: dict(e) for i, e in local.items()} if local is not None else {i: {} for i in range(count)}
        self.indices: list[int] = []  # the index of each of procs
        self._workers = workers
        self._env = dict(env)
        self._pump = pump
        self._log = log
        self.budget = RestartBudget(max_restarts, self._local)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.on_start: Callable[[int], None] = lambda pid: None  # the launcher's reaper learns restarted pids
        self._cwd: str | None = None
        self._reported: set[int] = set()
        self.failures: list[Failure] = []  # servers that ended while the workers ran and were not restarted

    def start(self, cwd: str | None = None) -> list[int]:
        """Start every server of this machine; returns their pids (each the leader of its process group)."""
        self._cwd = cwd  # restarts run there too
        for i in self._local:
            self.procs.append(self._spawn(i, 0))
            self.indices.append(i)
        return [p.pid for p in self.procs]

    def _spawn(self, i: int, generation: int) -> subprocess.Popen[bytes]:
        """Start server ``i`` (``generation`` > 0: a restart, which restores its checkpoint first)."""
        proc = subprocess.Popen(
            server_argv(i, self._workers, generation),
            env=self._server_env(i),
            cwd=self._cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self._merge_stderr else subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        key = server_key(i, generation)  # a restart's output is a stream of its own: [ps0.restart1]
        self._pump.labels[key] = server_label(i, generation)
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
                self.budget.watch(i, p.pid)
                continue
            if i in self._reported:
                continue
            how, generation, reason = self.budget.ended(i, code, self._server_env(i), self._log)
            said = f"hora run: parameter server {i} (pid {p.pid}) {how} while the workers were running"
            if generation is not None:
                print(f"{said}; {restarting(generation, self.budget.max_restarts)}", file=sys.stderr, flush=True)
                self.procs[j] = self._spawn(i, generation)
                self.on_start(self.procs[j].pid)
                continue
            self._reported.add(i)
            print(f"{said}; {reason}", file=sys.stderr, flush=True)
            key = server_key(i, self.budget.restarts[i])
            tail = list(self._pump.tails.get(key, []))
            self.failures.append(server_failure(i, key, socket.gethostname(), p.pid, code, tail))

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
