"""The hora agent that ``hora run`` starts on each remote host over SSH: ``python -m hora.runner.host_agent``.

It reads its job description, the job secret included, as one length-prefixed JSON message on stdin, so the secret
never appears on a command line or in the SSH command's environment string (``ps`` on either host cannot show it).
It starts that host's ranks the way the local launcher does (a session per rank, PR_SET_PDEATHSIG) and reports on
its stdout, in binary frames: that it started, each rank's pid, every chunk of output, and each rank's exit (and,
with ``--system-metrics``, batches of the host's system metric samples).

With ``--num-ps``/``--ps-per-host`` it also starts the host's parameter servers (``python -m hora.ps``, with the
environment of the host's first rank), reported under the negative numbers ``-1 - index`` like the launcher's own
(``[psI]``). They serve the ranks of every host, so they outlive this host's ranks: they stop when the launcher
says the job is over (the end of stdin), not when this host's ranks are done. With ``--max-restarts R`` the agent
restarts a server of its host that dies (or stays stopped, SIGSTOP) while the job runs, as the launcher does for its
own (:class:`hora.runner.ps_servers.RestartBudget`): the restart is reported as started under a key of its own
(``[psI.restartG]``), and past R restarts the server is given up at the job's store so the workers fail naming it.

Later messages on stdin forward signals to ranks, or ask for the stacks of this host's running ranks: each rank dumps
its threads (faulthandler, SIGUSR1) into the agent's private stacks directory (``HORA_STACKS_DIR``, removed when the
agent ends) and the agent sends every dump back, as ``hora run`` takes its local ranks' stacks. When stdin reaches
EOF — the launcher finished, died, or the SSH connection broke — the agent stops its ranks (SIGTERM, then SIGKILL
after the grace period) and exits, so no rank outlives its launcher. The agent's own parent-death signal covers an
sshd that goes away without closing stdin.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

from hora._proc import die_with_parent, kill_group, set_parent_death_signal, usable_cpus
from hora.config import Config
from hora.config.launchers import without_launcher_variables
from hora.config.variables import environment
from hora.config.worker_env import thread_defaults
from hora.errors import ConfigError, HoraError
from hora.runner.agent_protocol import (
    CLOSED,
    ERROR,
    EXITED,
    HEADER,
    HELLO,
    OUTPUT,
    STACKS,
    STARTED,
    SYSTEM,
    interface_address,
    read_message,
)
from hora.runner.limits import process_count_problem
from hora.runner.ps_servers import RestartBudget, server_argv, server_key, server_of
from hora.runner.stacks import agent_stacks
from hora.runner.system_metrics import SystemSampler


class _Agent:
    def __init__(self, job: dict[str, Any], out: IO[bytes]) -> None:
        self.job = job
        self.out = out
        self.grace = float(job.get("grace", 3.0))
        self.lock = threading.Lock()
        self.broken = False  # the launcher's end of stdout is gone: nothing more to report
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.codes: dict[int, int] = {}
        self.stopping_at: float | None = None
        self.open_streams = 0
        self.sel = selectors.DefaultSelector()
        self.stdin_open = True
        self.workers = 0
        self.server_env: dict[int, dict[str, str]] = {}  # index -> environment of this host's servers
        self.budget: RestartBudget | None = None
        self.pending: list[tuple[int, list[str], dict[str, Any]]] = []  # restarts to start
        self.stacks = agent_stacks()  # private (0700): where this host's ranks dump their stacks

    def send(self, kind: int, rank: int = -1, stream: int = 0, payload: bytes = b"") -> None:
        with self.lock:
            if self.broken:
                return
            try:
                self.out.write(HEADER.pack(kind, rank, stream, len(payload)) + payload)
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.broken = True
                self.stop(signal.SIGTERM)

    def start(self) -> None:
        # Another launcher's per-process variables are not the ranks': started as a job step (hora job in a Slurm
        # allocation starts this agent with srun), SLURM_STEP_ID/SLURM_PROCID would make every rank rank 0 of 1.
        env = without_launcher_variables(environment())
        env.update(self.job["env"])
        env["HORA_STACKS_DIR"] = str(self.stacks.directory)
        iface = self.job.get("network_interface")
        if iface:
            env["HORA_BIND_ADDR"] = interface_address(iface)
        self.workers = int(self.job.get("workers", 0))
        try:
            allowed = Config.resolve(env=env).oversubscribe
        except ConfigError:
            allowed = False  # the ranks report the bad setting themselves
        count = len(self.job["ranks"]) + len(self.job.get("servers", []))
        problem = process_count_problem(count, f"hora run on {socket.gethostname()}", allowed)
        if problem:
            raise ConfigError(problem)
        for e in self.job["ranks"]:
            self._spawn(int(e["rank"]), list(self.job["command"]), {**env, **e["env"]})
        for s in self.job.get("servers", []):
            index = int(s["index"])
            self.server_env[index] = {**env, **s["env"]}
            self._spawn(server_key(index), server_argv(index, self.workers), self.server_env[index])
        if self.server_env:  # the workers' own setting: restart a dead server up to R times (--max-restarts)
            max_restarts = Config.resolve(env=next(iter(self.server_env.values()))).ps_max_restarts
            self.budget = RestartBudget(max_restarts, self.server_env)

    def _spawn(self, key: int, argv: list[str], env: dict[str, str], info: dict[str, Any] | None = None) -> None:
        """Start a rank (``key`` >= 0) or a server (``key`` < 0, :func:`server_key`), reported as started."""
        thread_defaults(env, int(env.get("HORA_LOCAL_SIZE", "1")), usable_cpus())
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self.job.get("merge_stderr") else subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,  # the forked rank dies with the agent
        )
        self.procs[key] = proc
        for stream, pipe in ((1, proc.stdout), (2, proc.stderr)):
            if pipe is None:
                continue
            os.set_blocking(pipe.fileno(), False)
            self.sel.register(pipe, selectors.EVENT_READ, (key, stream))
            self.open_streams += 1
        self.send(STARTED, key, 0, json.dumps({"pid": proc.pid, **(info or {})}).encode())
        if proc.stderr is None:  # merged into stdout: the launcher learns there is nothing more on stderr
            self.send(CLOSED, key, 2)

    def _server_ended(self, key: int, code: int) -> dict[str, Any]:
        """A server ended: while the job runs, restart it if the budget allows (``--max-restarts``), else give it
        up. Returns what the launcher is told beside the exit code."""
        index, _ = server_of(key)
        if self.budget is None or self.stopping_at is not None or not self.stdin_open:
            return {}
        how, generation, reason = self.budget.ended(index, code, self.server_env[index], _say)
        if generation is None:
            return {"how": how, "given_up": reason}
        argv = server_argv(index, self.workers, generation)
        self.pending.append((server_key(index, generation), argv, {"index": index, "generation": generation}))
        return {"how": how, "restart": generation, "max_restarts": self.budget.max_restarts}

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        for rank, proc in self.procs.items():
            if (ranks is None or rank in ranks) and rank not in self.codes:
                kill_group(proc.pid, sig)

    def send_stacks(self, ranks: list[int] | None, wait: float) -> None:
        """The stacks of the running ranks among ``ranks`` (all with None) that answer within ``wait`` seconds."""
        pids = {
            r: p.pid for r, p in self.procs.items() if r >= 0 and r not in self.codes and (ranks is None or r in ranks)
        }
        for rank, dump in self.stacks.capture(pids, wait).items():
            self.send(STACKS, rank, 0, dump.encode())

    def stop(self, sig: int) -> None:
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()
            self.signal(sig)

    def pump(self, timeout: float) -> None:
        """Forward whatever output is ready and report ranks that exited."""
        if self.open_streams:
            for key, _ in self.sel.select(timeout):
                rank, stream = key.data
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    self.send(OUTPUT, rank, stream, data)
                else:
                    self.sel.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    self.open_streams -= 1
                    self.send(CLOSED, rank, stream)
        else:
            time.sleep(timeout)
        for rank, proc in list(self.procs.items()):
            if rank in self.codes:
                continue
            code = proc.poll()
            if code is None:
                if rank < 0 and self.budget is not None and self.stopping_at is None:
                    self.budget.watch(server_of(rank)[0], proc.pid)  # a frozen server is killed, then restarted
                continue
            self.codes[rank] = code
            kill_group(proc.pid, signal.SIGKILL)  # whatever is left of its session goes with it
            said = self._server_ended(rank, code) if rank < 0 else {}
            self.send(EXITED, rank, 0, json.dumps({"code": code, **said}).encode())
        while self.pending:  # restarts, started once their predecessor's exit was told
            server, argv, info = self.pending.pop(0)
            self._spawn(server, argv, self.server_env[info["index"]], info)
        if self.stopping_at is not None and time.monotonic() - self.stopping_at > self.grace:
            self.signal(signal.SIGKILL)

    @property
    def done(self) -> bool:
        return len(self.codes) == len(self.procs)


def _say(message: str) -> None:
    print(f"hora agent: {message}", file=sys.stderr, flush=True)


def main() -> int:
    set_parent_death_signal(signal.SIGTERM)  # sshd's session ended without closing our stdin
    # Frames own the real stdout; anything else printed (a stray print, a warning) goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    received: list[int] = []
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, lambda signum, frame: received.append(signum))
    try:
        ready, _, _ = select.select([0], [], [], 120.0)
        if not ready:
            raise TimeoutError("no job description arrived on stdin within 120s")
        job = read_message(0)
    except (EOFError, ValueError, TimeoutError, OSError) as exc:
        print(f"hora agent on {socket.gethostname()}: {exc}", file=sys.stderr)
        return 2
    agent = _Agent(job, out)
    sampler = _sampler(agent, job.get("system_metrics_interval"))
    try:
        return _serve(agent, job, received)
    finally:
        if sampler is not None:  # the last sample goes back before the session ends
            sampler.stop()
        agent.stacks.save(None, keep=False)  # removes the stacks directory


def _sampler(agent: _Agent, interval: Any) -> SystemSampler | None:
    """``--system-metrics``: this host's samples, sent back to the launcher in batches."""
    if not interval:
        return None

    def send(batch: list[tuple[float, str, float]]) -> None:
        agent.send(SYSTEM, -1, 0, json.dumps(batch).encode())

    try:
        return SystemSampler(float(interval), send).start()
    except (HoraError, OSError) as exc:
        _say(f"no system metrics from {socket.gethostname()}: {exc}")
        return None


def _serve(agent: _Agent, job: dict[str, Any], received: list[int]) -> int:
    agent.send(HELLO, -1, 0, json.dumps({"pid": os.getpid(), "hostname": socket.gethostname()}).encode())
    try:
        os.chdir(job["cwd"])
    except OSError as exc:
        agent.send(
            ERROR,
            payload=f"the working directory {job['cwd']!r} does not exist here ({exc.strerror}); hora run starts "
            "remote ranks in the launcher's directory: use a directory that exists on every host".encode(),
        )
        return 1
    try:
        agent.start()
    except ConfigError as exc:
        agent.send(ERROR, payload=str(exc).encode())
        return 1
    except OSError as exc:
        agent.send(ERROR, payload=f"cannot start {job['command'][0]!r}: {exc.strerror or exc}".encode())
        agent.signal(signal.SIGKILL)
        return 1
    while not agent.done or agent.open_streams:
        if received:
            agent.stop(received.pop())
        if agent.stdin_open:
            ready, _, _ = select.select([0], [], [], 0)
            if ready:
                try:
                    message = read_message(0, 1 << 16)
                except (EOFError, OSError, ValueError):
                    agent.stdin_open = False  # the launcher is gone (or finished): stop everything
                    if agent.stopping_at is not None:  # the ranks are stopping already; the servers go now
                        agent.signal(signal.SIGTERM, [key for key in agent.procs if key < 0])
                    agent.stop(signal.SIGTERM)
                else:
                    if "stacks" in message:
                        agent.send_stacks(message["stacks"], min(float(message.get("wait", 1.0)), 10.0))
                    if "signal" in message:
                        sig = int(message["signal"])
                        if (
                            sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
                            and agent.stopping_at is None
                        ):
                            agent.stopping_at = time.monotonic()
                        agent.signal(sig, message.get("ranks"))
        agent.pump(0.05)
        if agent.done and agent.open_streams and agent.stopping_at is None:
            # a rank's child holds its pipe open: give it the grace period
            agent.stopping_at = time.monotonic()
        if (
            agent.done
            and agent.stopping_at is not None
            and time.monotonic() - agent.stopping_at > agent.grace + 2
        ):
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
