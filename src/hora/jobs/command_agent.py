"""A small authenticated command agent over TCP: what each host of a ``hora job`` on a Ray cluster runs on its node
(:mod:`hora.jobs.ray_hosts`), so that the supervisor reaches the node as it reaches an SSH host. Its client,
:mod:`hora.jobs._ray_rsh`, is hora run's ``SshOptions.agent``.

The agent listens on the node's address. Every connection starts with hora's challenge-response handshake on the
job's agent secret (:mod:`hora._runtime.auth`, role AGENT) before a byte of payload is parsed; then both sides
exchange frames, each a 1-byte kind and a 4-byte length checked against :data:`MAX_FRAME` before anything is
allocated::

    client -> agent   REQUEST {"command": ...} (first, once), STDIN bytes, STDIN_EOF, PING
    agent -> client   STDOUT bytes, STDERR bytes, PING, EXIT status (4 bytes, signed: -N = killed by signal N)

The command runs as ``/bin/sh -c COMMAND`` in a session of its own, in the agent's environment plus
``SSH_CONNECTION`` as sshd sets it (hora run's host check reads the supervisor's address from it), in the agent's
home directory. Both sides send a PING every :data:`HEARTBEAT` seconds while they wait; a side that hears nothing
for :data:`LOST_AFTER` seconds takes the other as lost (as ssh's ServerAliveInterval/ClientAliveInterval do). A
client that goes away — closed, killed, or lost — takes the command's process group down (SIGTERM, SIGKILL after
:data:`GRACE` seconds), as closing an SSH session does.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Mapping
from typing import IO

from hora._proc import die_with_parent
from hora._runtime.auth import Role, server_handshake
from hora._runtime.connections import bind_listener
from hora._runtime.gate import PendingHandshakes, RejectLog
from hora._wire import recv_exact
from hora.errors import HoraError, ProtocolError

__all__ = [
    "CHUNK", "EXIT", "FRAME", "HANDSHAKE_SECONDS", "HEARTBEAT", "LOST_AFTER", "MAX_FRAME", "PING", "REQUEST", "STDERR",
    "STDIN", "STDIN_EOF", "STDOUT", "CommandAgent", "beat", "keepalive", "recv_frame", "send_frame", "wait_readable",
]  # fmt: skip

FRAME = struct.Struct("!BI")
REQUEST, STDIN, STDIN_EOF, STDOUT, STDERR, EXIT, PING = 1, 2, 3, 4, 5, 6, 7
#: The largest frame either side accepts (the request, a chunk of a stream).
MAX_FRAME = 1 << 20
#: Bytes read from a stream per frame.
CHUNK = 64 << 10
HANDSHAKE_SECONDS = 10.0
#: Seconds between two PINGs of a waiting side; silence for LOST_AFTER seconds means the other side is lost.
HEARTBEAT = 5.0
LOST_AFTER = 15.0
#: Seconds between SIGTERM and SIGKILL to a command whose client went away.
GRACE = 2.0
_EXIT = struct.Struct("!i")


def send_frame(sock: socket.socket, lock: threading.Lock, kind: int, payload: bytes = b"") -> None:
    with lock:
        sock.sendall(FRAME.pack(kind, len(payload)) + payload)


def recv_frame(sock: socket.socket, what: str) -> tuple[int, bytes]:
    """One frame; a length above :data:`MAX_FRAME` is a :class:`ProtocolError` before anything is allocated."""
    kind, length = FRAME.unpack(recv_exact(sock, FRAME.size, what))
    if length > MAX_FRAME:
        raise ProtocolError(f"{what} announced a frame of {length} bytes, above the limit of {MAX_FRAME}")
    return kind, recv_exact(sock, length, what) if length else b""


def wait_readable(sock: socket.socket, seconds: float) -> bool:
    return bool(select.select([sock], [], [], seconds)[0])


def keepalive(sock: socket.socket) -> None:
    """TCP keepalives as a backstop beside the PINGs: a peer that vanished mid-frame is noticed too (~20 s)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def beat(sock: socket.socket, lock: threading.Lock, done: threading.Event) -> None:
    """PING every HEARTBEAT seconds until ``done`` (or the connection fails)."""
    while not done.wait(HEARTBEAT):
        try:
            send_frame(sock, lock, PING)
        except OSError:
            return


class _Session:
    """One connection: the handshake, the request, the command with its streams, its exit status."""

    def __init__(self, agent: CommandAgent, conn: socket.socket, peer: tuple[str, int]) -> None:
        self.agent, self.conn, self.peer = agent, conn, peer
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None

    def serve(self) -> None:
        agent, conn = self.agent, self.conn
        try:
            server_handshake(conn, agent.secret, HANDSHAKE_SECONDS, roles=(Role.AGENT,))
            conn.settimeout(HANDSHAKE_SECONDS)
            kind, body = recv_frame(conn, f"client {self.peer[0]}")
            if kind != REQUEST:
                raise ProtocolError(f"a first frame of kind {kind}, not a request")
            command = json.loads(body)["command"]
            if not isinstance(command, str):
                raise ProtocolError("a request whose command is not a string")
            conn.settimeout(None)
        except (HoraError, OSError, ValueError, KeyError, TypeError) as exc:
            agent.rejects.drop(f"{self.peer[0]}: {exc}")
            conn.close()
            return
        finally:
            agent.pending.finish(conn)
        keepalive(conn)
        local = conn.getsockname()
        env = {**agent.env, "SSH_CONNECTION": f"{self.peer[0]} {self.peer[1]} {local[0]} {local[1]}"}
        try:  # this thread lives until the command ends: its PR_SET_PDEATHSIG fires when the agent dies
            self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env, cwd=agent.cwd, start_new_session=True,
                                         preexec_fn=die_with_parent)
        except OSError as exc:
            self._finish(127, f"hora job: cannot run /bin/sh on this node: {exc.strerror}\n".encode())
            return
        assert self.proc.stdout is not None and self.proc.stderr is not None
        pumps = [threading.Thread(target=self._pump, args=(f, k), daemon=True)
                 for f, k in ((self.proc.stdout, STDOUT), (self.proc.stderr, STDERR))]
        for t in [*pumps, threading.Thread(target=self._read, daemon=True),
                  threading.Thread(target=beat, args=(conn, self.lock, self.done), daemon=True)]:
            t.start()
        code = self.proc.wait()
        for t in pumps:  # what it wrote before it ended; a daemon it left holding the pipes is not waited for
            t.join(timeout=5.0)
        self._finish(code)

    def _finish(self, code: int, message: bytes = b"") -> None:
        self.done.set()
        try:
            if message:
                send_frame(self.conn, self.lock, STDERR, message)
            send_frame(self.conn, self.lock, EXIT, _EXIT.pack(code))
        except OSError:
            pass
        try:  # wakes _read, which may wait in select() on this socket: close() alone would not (up to LOST_AFTER)
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()
        self.agent.forget(self)

    def _pump(self, stream: IO[bytes], kind: int) -> None:
        broken = False
        try:
            while data := os.read(stream.fileno(), CHUNK):
                if not broken:
                    try:
                        send_frame(self.conn, self.lock, kind, data)
                    except OSError:
                        broken = True  # the client is gone: _read stops the command; drain the pipe meanwhile
        finally:
            _close(stream)

    def _read(self) -> None:
        """The client's frames: its stdin into the command's; the command stopped when the client is lost."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        stdin: IO[bytes] | None = proc.stdin
        try:
            while True:
                if not wait_readable(self.conn, LOST_AFTER):
                    raise ProtocolError(f"no word from the client for {LOST_AFTER:g}s")
                kind, data = recv_frame(self.conn, "the client")
                if kind == STDIN and stdin is not None:
                    try:
                        stdin.write(data)
                        stdin.flush()
                    except (BrokenPipeError, ValueError):
                        stdin = None  # the command closed its stdin: the rest is dropped, as sshd does
                elif kind == STDIN_EOF and stdin is not None:
                    _close(stdin)
                    stdin = None
                elif kind not in (PING, STDIN, STDIN_EOF):
                    raise ProtocolError(f"a frame of unknown kind {kind}")
        except (HoraError, OSError, ValueError):
            if not self.done.is_set():  # the client went away while the command runs: as sshd, end it
                self.stop(GRACE)
        finally:
            if stdin is not None:
                _close(stdin)

    def stop(self, grace: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _close(f: IO[bytes]) -> None:
    try:
        f.close()
    except OSError:
        pass


class CommandAgent:
    """Runs the shell commands of authenticated clients (see the module docstring) on ``address``: a free port, or
    one of ``port_range`` (``LOW-HIGH``). :meth:`start` returns the port; :meth:`close` stops every command."""

    def __init__(self, secret: bytes, address: str, port_range: str = "", env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.secret = secret
        self.env = dict(env or {})
        self.cwd = cwd
        self.listener = bind_listener(address, port_range)
        self.pending = PendingHandshakes()
        self.rejects = RejectLog(logging.getLogger(__name__), "the command agent refused a connection")
        self.sessions: set[_Session] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="hora-command-agent", daemon=True)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> int:
        self._thread.start()
        return self.port

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                if not wait_readable(self.listener, 0.2):
                    continue
                conn, peer = self.listener.accept()
            except (OSError, ValueError) as exc:  # ValueError: closed meanwhile
                if self._closed.is_set():
                    return
                if isinstance(exc, OSError):
                    self.pending.make_room(exc)
                continue
            if not self.pending.admit(conn):
                continue
            session = _Session(self, conn, peer)
            with self._lock:
                self.sessions.add(session)
            threading.Thread(target=session.serve, name=f"hora-command-{peer[0]}", daemon=True).start()

    def forget(self, session: _Session) -> None:
        with self._lock:
            self.sessions.discard(session)

    def close(self, grace: float = GRACE) -> None:
        """Stop listening, end every command still running (SIGTERM, SIGKILL after ``grace``)."""
        self._closed.set()
        self.pending.close()
        self.listener.close()
        with self._lock:
            running = list(self.sessions)
        threads = [threading.Thread(target=s.stop, args=(grace,), daemon=True) for s in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
