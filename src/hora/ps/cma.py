"""Single-copy transfers between a worker and a server on the same host: the server reads the worker's gradient and
writes the pulled values straight from and into the worker's own arrays (Linux cross-memory attach,
``process_vm_readv``/``process_vm_writev``, as Open MPI's shared-memory transport does for large messages).

Through the shared segment alone every byte is copied twice more: the worker copies its gradient into the segment
and the reply out of it, and on this 2-core machine those copies cost as much CPU as the server's update. With this
path the worker only rings: the server streams the gradient in cache-sized chunks, updates each chunk and writes it
back, so a dense push_pull moves each byte once each way.

The kernel allows it where it allows ptrace: the same user (and Yama's ``ptrace_scope`` 0), or root. Whether it
does is found out once per segment: the worker writes a random token into its segment and announces, on its
authenticated connection, its pid and the token's address in its own memory; the server reads those bytes from
that pid and compares them with the segment it mapped. It grants single copy only when that pid also holds the
other end of the connection (:func:`connection_owners`): a worker cannot name another process that maps the
segment (one of the same user could), so the server only ever reads and writes the memory of the process that
connected and authenticated. Otherwise the segment's copies are used.
The server reads the token again before each request, so a pid that a dead worker left to another process is never
read or written. Every request's addresses are checked by the kernel (a bad one fails the call, and the server
drops the connection).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import struct

import numpy as np

from hora.errors import ProtocolError
from hora.ps.segment import TOKEN_AT

__all__ = ["ADDRESSES", "CMA_FLAG", "TOKEN", "RemoteMemory", "available", "connection_owners", "new_token"]

#: The bit of a hot request's op code that says "the payload and the reply are in the worker's memory".
CMA_FLAG = 0x80
#: At the segment's payload area of such a request: the address of the gradient and of the output, 0 for none.
ADDRESSES = struct.Struct("<QQ")
#: Bytes of the token that proves a segment's owner (:func:`new_token`).
TOKEN = 16


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc: ctypes.CDLL | None = None


def _calls() -> tuple[object, object] | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    read, write = getattr(_libc, "process_vm_readv", None), getattr(_libc, "process_vm_writev", None)
    if read is None or write is None:
        return None
    for f in (read, write):
        f.restype = ctypes.c_ssize_t
        f.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(_Iovec),
            ctypes.c_ulong,
            ctypes.POINTER(_Iovec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
    return read, write


def available() -> bool:
    """Whether this system has the calls (Linux with glibc); whether they are allowed is known only by trying."""
    return os.name == "posix" and _calls() is not None


def _proc_address(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp(6)`` writes it: the address in host order, 32 bits at a time, in hex."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    raw = socket.inet_pton(family, host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{words.hex().upper()}:{port:04X}"


def connection_owners(sock: socket.socket) -> set[int] | None:
    """The pids of the processes that hold the other end of ``sock``, a connection from a process of this host
    (``SO_PEERCRED`` for a Unix socket; for TCP, the socket inode ``/proc/net/tcp`` gives its end, then the
    processes whose descriptors point at it). None when it cannot be told (not Linux, not a local peer)."""
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return {struct.unpack("3i", creds)[0]}
    try:
        peer, mine = sock.getpeername()[:2], sock.getsockname()[:2]
        theirs, ours = _proc_address(*peer), _proc_address(*mine)
        table = "/proc/net/tcp6" if sock.family == socket.AF_INET6 else "/proc/net/tcp"
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return None
    inode = next((r[9] for r in rows if len(r) > 9 and r[1] == theirs and r[2] == ours), None)
    if inode is None:
        return None
    target, owners = f"socket:[{inode}]", set()
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{proc}/fd")
        except OSError:  # another user's, or gone
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{proc}/fd/{fd}") == target:
                    owners.add(int(proc))
                    break
            except OSError:
                continue
    return owners


def new_token(segment: np.ndarray) -> int:
    """Write a fresh random token into ``segment`` (the worker's, all of it) at ``TOKEN_AT``; returns its address."""
    segment[TOKEN_AT : TOKEN_AT + TOKEN] = np.frombuffer(secrets.token_bytes(TOKEN), np.uint8)
    return int(segment.ctypes.data) + TOKEN_AT


class RemoteMemory:
    """A worker process's memory, read and written by the server (one per connection)."""

    def __init__(self, pid: int, token_at: int, token: bytes) -> None:
        calls = _calls()
        if calls is None:
            raise OSError("process_vm_readv is not available")
        self.pid, self._token_at, self._token = pid, token_at, token
        self._read, self._write = calls

    @classmethod
    def verify(cls, pid: int, token_at: int, segment: np.ndarray) -> RemoteMemory | None:
        """The worker ``pid``'s memory if the :data:`TOKEN` bytes at ``token_at`` there are the token in
        ``segment`` (the worker's segment as this server mapped it); None when the kernel refuses or they differ."""
        if not available() or pid <= 0 or segment.nbytes < TOKEN_AT + TOKEN:
            return None
        remote = cls(pid, token_at, bytes(segment[TOKEN_AT : TOKEN_AT + TOKEN]))
        try:
            remote.check()
        except ProtocolError:
            return None
        return remote

    def check(self) -> None:
        """Read the token again: ``pid`` is still the process that owns the segment (not a new process that got a
        dead worker's pid). One 16-byte read before each request."""
        got = np.empty(TOKEN, np.uint8)
        self.read(self._token_at, got)
        if bytes(got) != self._token:
            raise ProtocolError(f"process {self.pid} no longer holds its shared segment's token")

    def _move(self, call: object, local: np.ndarray, address: int, what: str) -> None:
        n = local.nbytes
        if not n:
            return
        if not local.flags.c_contiguous:
            raise ProtocolError(f"{what}: the local buffer is not contiguous")
        mine, theirs = _Iovec(local.ctypes.data, n), _Iovec(address, n)
        done = call(self.pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)  # type: ignore[operator]
        if done != n:
            err = ctypes.get_errno() if done < 0 else 0
            why = os.strerror(err) if err else f"{done} of {n} bytes"
            raise ProtocolError(f"{what} {n} bytes at {address:#x} of worker pid {self.pid} failed ({why})")

    def read(self, address: int, into: np.ndarray) -> None:
        """Copy ``into.nbytes`` bytes from the worker's ``address`` into ``into``."""
        self._move(self._read, into, address, "reading")

    def write(self, address: int, data: np.ndarray) -> None:
        """Copy ``data`` to the worker's ``address``."""
        self._move(self._write, data, address, "writing")
