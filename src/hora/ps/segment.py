"""A worker's shared segment with one server on its host, and the segment's futex doorbell: hot requests skip the
socket entirely.

The client creates a segment of its own in /dev/shm (a random name, mode 0600, created exclusively), announces it
on its authenticated connection (``{"op": "shm", "name", "size"}``), and unlinks it as soon as the server has mapped
it, so no crash can leave it behind. The server checks the segment's owner, mode and size before mapping it.

The segment starts with a control block (:data:`DATA` bytes): two 32-bit doorbell words and the binary headers of
:mod:`hora.ps.protocol`; the payloads follow it. A hot request (push, pull, rows) is its header written at
:data:`HEAD`, its payload at :data:`DATA`, and the request word incremented and woken (a futex); the server answers
with a reply header at :data:`REPLY_AT`, the reply's payload at :data:`DATA`, and the reply word set to the same
count. One request at a time per connection, so nothing else orders the uses of the segment. A control message
still travels on the socket; the client rings with :data:`SOCKET_CODE` so the server reads it. Both sides wait in
slices and check the socket between them, so a peer that dies is noticed without a reply. The server checks every
header field and length read from the segment (copied out first) against the segment's size before using it.
"""

from __future__ import annotations

import mmap
import os
import secrets
import select
import socket
import time

import numpy as np

from hora._transport import futex
from hora.errors import ProtocolError
from hora.ps.protocol import REPLY, REPLY_MAGIC, REQUEST, REQUEST_MAGIC

__all__ = [
    "DATA",
    "HEAD",
    "PREFIX",
    "REPLY_AT",
    "REP_WORD",
    "REQ_WORD",
    "SOCKET_CODE",
    "TOKEN_AT",
    "Segment",
    "spin_readable",
    "spin_until",
]

PREFIX = "hora-ps-"
_DIR = "/dev/shm"
#: Byte offsets of the control block: the request and reply doorbell words (their own cache lines), the request
#: header and name, the reply header; the payloads start at DATA.
REQ_WORD, REP_WORD, HEAD, REPLY_AT, DATA = 0, 64, 128, 2048, 4096
#: Where the worker keeps the token that proves it owns the segment to a single-copy server (:mod:`hora.ps.cma`).
TOKEN_AT = 3072
#: The op code of a doorbell that says "a control message is on the socket".
SOCKET_CODE = 0x7F


def spin_until(words: memoryview, index: int, value: int, seconds: float) -> bool:
    """Poll ``words[index]`` for ``value`` for up to ``seconds``, yielding the core (and the GIL) between looks:
    a futex wake-up costs tens of microseconds on a busy virtual machine, a look a fraction of one."""
    if words[index] == value:
        return True
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        os.sched_yield()
        if words[index] == value:
            return True
    return False


def spin_readable(sock: socket.socket, seconds: float) -> bool:
    """Poll ``sock`` for data for up to ``seconds`` (yielding the core between looks) before a blocking read, which
    would cost a wake-up: the same trade as :func:`spin_until`, for the socket."""
    end = time.perf_counter() + seconds
    while True:
        if select.select([sock], [], [], 0)[0]:
            return True
        if time.perf_counter() >= end:
            return False
        os.sched_yield()


class Segment:
    """A mapped segment; ``u8`` is a uint8 view of all of it."""

    def __init__(self, mm: mmap.mmap, name: str, size: int) -> None:
        self._mm: mmap.mmap | None = mm
        self.name, self.size = name, size
        self.u8 = np.frombuffer(mm, np.uint8)
        self.data = self.u8[DATA:]
        # headers are packed and unpacked in place (struct), no numpy on the hot path
        self.mv = memoryview(mm)
        self.words = self.mv[:DATA].cast("I")
        self.base = int(self.u8.ctypes.data)
        self.seq = 0  # the last request count rung (client) or served (server)
        self.single_copy = False  # the server reads and writes this worker's arrays itself (hora.ps.cma)

    def address(self, word: int) -> int:
        """The address of the doorbell word at byte offset ``word`` (for futex waits)."""
        return self.base + word

    def ring(self, code: int, name: bytes = b"", shard: int = 0, rows: int = 0, nbytes: int = 0) -> None:
        """The worker's side: write a request header (``nbytes`` of payload at :data:`DATA`), count it on the
        request word and wake the server."""
        REQUEST.pack_into(self.mv, HEAD, REQUEST_MAGIC, code, len(name), shard, rows, 0, nbytes)
        self.mv[HEAD + REQUEST.size : HEAD + REQUEST.size + len(name)] = name
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.words[REQ_WORD // 4] = self.seq
        futex.wake(self.base + REQ_WORD)

    def answer(self, status: int, n: int) -> None:
        """The server's side: write the reply header (``n`` bytes at :data:`DATA`; status 0: ok, 1: a JSON error),
        set the reply word to the request's count and wake the worker."""
        REPLY.pack_into(self.mv, REPLY_AT, REPLY_MAGIC, status, 0, 0, 0, n)
        self.words[REP_WORD // 4] = self.seq
        futex.wake(self.base + REP_WORD)

    @classmethod
    def create(cls, size: int) -> Segment:
        name = PREFIX + secrets.token_hex(16)
        path = os.path.join(_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # a full /dev/shm fails here (ENOSPC), not later with SIGBUS
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(mm, name, size)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        """Map a worker's segment; refuse names outside hora's, other owners and sizes that differ."""
        if not name.startswith(PREFIX) or os.path.basename(name) != name or not DATA < size <= 1 << 40:
            raise ProtocolError(f"refusing shared-memory segment {name!r} of {size} bytes")
        fd = os.open(os.path.join(_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_size != size or st.st_mode & 0o077:
                raise ProtocolError(
                    f"shared-memory segment {name} is not this user's private segment of {size} bytes"
                )
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(mm, name, size)

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(_DIR, self.name))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._mm is not None:
            self.u8 = self.data = np.empty(0, np.uint8)
            self.words.release()
            self.mv.release()
            try:
                self._mm.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes when it does
                pass
            self._mm = None
