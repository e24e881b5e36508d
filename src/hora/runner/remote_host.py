"""The launcher's side of a remote host: one SSH session running the hora agent (:mod:`hora.runner.host_agent`).

The job description and the secret go to the agent on the session's stdin; the agent's frames come back on its
stdout and are turned into rank pids, output lines (through the launcher's :class:`OutputPump`, so remote ranks are
prefixed and recorded like local ones) and exit codes. The host's parameter servers, if any, are reported the same
way under ``-1 - index``; one that ends before the job does is reported as the launcher reports its own. Closing
stdin tells the agent to stop its ranks and servers; the SSH client itself runs in its own session with
PR_SET_PDEATHSIG, so a launcher that dies takes the session, and with it every remote rank and server, down too.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO, Any

from hora._proc import kill_group
from hora._wire import read_fully
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
    write_message,
)
from hora.runner.output import OutputPump
from hora.runner.ps_servers import report_exit, restarting, server_failure, server_key, server_label, server_of
from hora.runner.result import Failure

__all__ = ["RemoteHost", "RemoteRank"]

_STREAMS = {1: "stdout", 2: "stderr"}
#: Exit code reported for ranks whose host's SSH session ended before they reported their own (as ssh does).
LOST = 255


class RemoteRank:
    """A rank on a remote host, as the launcher sees it: pid and exit code as the agent reports them."""

    def __init__(self, rank: int, host: RemoteHost) -> None:
        self.rank = rank
        self.host = host
        self.pid = 0
        self.reason = ""  # set when the rank "failed" because its host did (lost connection, agent error)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def signal(self, sig: int) -> None:
        self.host.signal(sig, [self.rank])

    def reaped(self) -> None:
        """The agent already killed what was left of the rank's session."""


class RemoteHost:
    """One SSH session to ``host`` that runs ``ranks`` through the agent."""

    def __init__(
        self,
        host: str,
        ranks: Sequence[int],
        argv: list[str],
        job: dict[str, Any],
        pump: OutputPump,
        start_timeout: float,
        child_setup: Callable[[], None],
        echo_stderr: bool = True,
        servers: Sequence[int] = (),
    ) -> None:
        self.host = host
        self.ranks = {r: RemoteRank(r, self) for r in ranks}
        self.servers = list(servers)  # indexes of the host's parameter servers
        self.server_pids: dict[int, int] = {}  # output key (server_key) -> pid, restarts included
        self.server_codes: dict[int, int] = {}
        self.server_failures: list[Failure] = []  # its servers that ended while the workers ran, not restarted
        self.argv = argv
        self._job = job
        self._pump = pump
        self._start_timeout = start_timeout
        self._child_setup = child_setup
        self._echo = echo_stderr
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello = False
        self.agent_pid = 0
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started_at = 0.0
        self._open: set[tuple[int, str]] = set()
        self._stdin_closed = False
        self.stacks: dict[int, str] = {}  # rank -> the dump its host's agent sent back
        self._stacks_came = threading.Condition()
        #: where the host's system metric samples go (``--system-metrics``): called with the host and a batch
        self.on_system: Callable[[str, list[Any]], None] | None = None

    def start(self) -> None:
        """Start the ssh client (threads come later: the launcher forks every process before starting threads)."""
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=self._child_setup,
        )
        self._started_at = time.monotonic()
        for i in self.servers:
            self._pump.labels[server_key(i)] = server_label(i, 0)
            self.server_pids[server_key(i)] = 0  # its output is expected
        for r in [*self.ranks, *(server_key(i) for i in self.servers)]:
            self._pump.add_remote(r)
            self._open |= {(r, "stdout"), (r, "stderr")}

    def start_threads(self) -> None:
        for target, name in ((self._read_frames, "frames"), (self._read_stderr, "stderr")):
            t = threading.Thread(target=target, name=f"hora-ssh-{self.host}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    # -- reading the agent ---------------------------------------------------------------------------------------
    def _read_frames(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            with self._lock:
                write_message(self.proc.stdin, self._job)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the session already ended: the end of stdout below says so
        stdout = self.proc.stdout
        try:
            while True:
                header = _read_exact(stdout, HEADER.size)
                if header is None:
                    break
                kind, rank, stream, length = HEADER.unpack(header)
                payload = _read_exact(stdout, length) if length else b""
                if payload is None:
                    break
                self._handle(kind, rank, stream, payload)
        finally:
            self._lost()

    def _handle(self, kind: int, rank: int, stream: int, payload: bytes) -> None:
        if kind == HELLO:
            self.hello = True
            self.agent_pid = int(json.loads(payload)["pid"])
        elif kind == STARTED and rank in self.ranks:
            self.ranks[rank].pid = int(json.loads(payload)["pid"])
        elif kind in (STARTED, EXITED) and rank < 0 and server_of(rank)[0] in self.servers:
            self._server(rank, kind, json.loads(payload))
        elif kind == OUTPUT and (rank in self.ranks or rank in self.server_pids) and stream in _STREAMS:
            self._pump.feed(rank, _STREAMS[stream], payload)
        elif kind == CLOSED and (rank, _STREAMS.get(stream, "")) in self._open:
            self._open.discard((rank, _STREAMS[stream]))
            self._pump.close_remote(rank, _STREAMS[stream])
        elif kind == EXITED and rank in self.ranks:
            self.ranks[rank].returncode = int(json.loads(payload)["code"])
        elif kind == STACKS and rank in self.ranks:
            with self._stacks_came:
                self.stacks[rank] = payload.decode(errors="replace")
                self._stacks_came.notify_all()
        elif kind == SYSTEM and self.on_system is not None:
            try:
                batch = json.loads(payload)
            except ValueError:
                batch = None  # the log names a malformed batch
            self.on_system(self.host, batch if isinstance(batch, list) else [None])
        elif kind == ERROR:
            self._fail_all(f"host {self.host}: {payload.decode(errors='replace')}", 1)

    def _server(self, key: int, kind: int, info: dict[str, Any]) -> None:
        """A server of this host started (a restart: its output is a stream of its own) or ended; the agent says
        whether it restarts it (``--max-restarts``)."""
        index, generation = server_of(key)
        if kind == STARTED:
            if generation:
                self._pump.labels[key] = server_label(index, generation)
                self._pump.add_remote(key)
                self._open |= {(key, "stdout"), (key, "stderr")}
            self.server_pids[key] = int(info["pid"])
            return
        code = int(info["code"])
        self.server_codes[key] = code
        with self._lock:
            over = self._stdin_closed  # the launcher ended the job: the agent stopped the server
        if over:
            return
        pid, where = self.server_pids.get(key, 0), f" on host {self.host}"
        if "restart" not in info:  # not restarted: the workers fail naming it, and it is the root cause
            tail = list(self._pump.tails.get(key, []))
            self.server_failures.append(server_failure(index, key, self.host, pid, code, tail))
        if "how" not in info:
            report_exit(index, pid, code, where)
            return
        said = f"hora run: parameter server {index} (pid {pid}){where} {info['how']} while the workers were running"
        if "restart" in info:
            said += f"; {restarting(int(info['restart']), int(info['max_restarts']))}"
        else:
            said += f"; {info['given_up']}"
        print(said, file=sys.stderr, flush=True)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.stderr_tail.append(line)
            if self._echo:
                try:
                    sys.stderr.write(f"[{self.host}]<ssh>: {line}\n")
                    sys.stderr.flush()
                except (ValueError, OSError):
                    pass

    def _lost(self) -> None:
        """The session ended: every rank that did not report its exit has failed with its host."""
        code: int | None = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        for t in self._threads:
            if t is not threading.current_thread() and t.name.endswith("stderr"):
                t.join(timeout=2.0)
        tail = "; ".join(x for x in list(self.stderr_tail)[-3:] if x.strip())
        program = "ssh" if self.argv[0] == "ssh" else "its rsh agent"  # SshOptions.agent: hora job's hosts
        why = f"{program} exited with {code}" if code is not None else f"{program} stopped answering"
        self._fail_all(f"lost the connection to host {self.host} ({why}{': ' + tail if tail else ''})", LOST)
        for rank, stream in sorted(self._open):
            self._pump.close_remote(rank, stream)
        self._open.clear()

    def _fail_all(self, reason: str, code: int) -> None:
        for r in self.ranks.values():
            if r.returncode is None:
                r.reason = reason
                r.returncode = code

    # -- controlling it ------------------------------------------------------------------------------------------
    def check(self, now: float) -> None:
        """Fail the host's ranks when its agent never said hello within the start time-out."""
        if not self.hello and now - self._started_at > self._start_timeout and self.proc is not None:
            self._fail_all(
                f"host {self.host}: the hora agent did not start within {self._start_timeout:g}s "
                "(is hora installed there, at the same Python path?)",
                LOST,
            )
            self.kill()

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        self._tell({"signal": int(sig), "ranks": ranks})

    def ask_stacks(self, ranks: list[int], wait: float) -> None:
        """Ask the agent for the stacks of ``ranks`` (those that answer within ``wait`` s); see :meth:`take_stacks`."""
        with self._stacks_came:
            for r in ranks:
                self.stacks.pop(r, None)
        self._tell({"stacks": list(ranks), "wait": wait})

    def take_stacks(self, ranks: list[int], deadline: float) -> dict[int, str]:
        """The dumps of ``ranks`` that came back by ``deadline`` (monotonic)."""
        with self._stacks_came:
            while not all(r in self.stacks for r in ranks) and (left := deadline - time.monotonic()) > 0:
                self._stacks_came.wait(left)
            return {r: self.stacks[r] for r in ranks if r in self.stacks}

    def _tell(self, message: dict[str, Any]) -> None:
        if self.proc is None or self.proc.stdin is None:
            return
        with self._lock:
            if self._stdin_closed:
                return
            try:
                write_message(self.proc.stdin, message)
            except (BrokenPipeError, OSError, ValueError):
                pass

    def close(self, timeout: float) -> None:
        """Tell the agent the job is over (it stops whatever still runs), then wait for the session to end."""
        if self.proc is None:
            return
        with self._lock:
            self._stdin_closed = True
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        for t in self._threads:
            t.join(timeout=5.0)

    def kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, signal.SIGKILL)


def _read_exact(f: IO[bytes], n: int) -> bytes | None:
    data = read_fully(f.read, n)
    return data if len(data) == n else None
