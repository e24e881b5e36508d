"""The parameter-server wire format, spoken only after the handshake of :mod:`hora._runtime.auth` (role ``PS``).

Two kinds of message share a connection, told apart by their first byte:

- **Control** (``register``, ``layout``, ``poison``, ``stats``, ``save``, ``load``, ``shm``, errors: the records
  of :mod:`hora.ps.messages`): a JSON header frame (an 8-byte big-endian length of at most :data:`MAX_HEADER`, so
  a first byte of 0) and, when the header says ``"nbytes": n`` with ``n > 0``, one payload frame of exactly ``n``
  bytes.
- **Hot** (``push``, ``pull``, ``push_pull``, ``push_rows``, ``pull_rows``: :class:`~hora.ps.messages.Op`, whose
  value is the op code): a fixed binary header (:data:`REQUEST`, first byte :data:`REQUEST_MAGIC`) and the
  variable's name, then exactly ``nbytes`` payload bytes; the reply is a fixed :data:`REPLY` header (first byte
  :data:`REPLY_MAGIC`) and its payload, or a JSON error. No JSON is built or parsed on the hot path.

Payloads are raw array bytes (C order, the variable's dtype; row ids as little-endian int64). The receiver knows
how many bytes to expect from what it holds (the shard's shape, the row count times the row size) and refuses any
other length before reading or allocating it. Nothing is unpickled; JSON headers are plain objects whose fields
the receiver checks.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from hora import errors
from hora._wire import recv_exact, recv_frame, recv_into_exact
from hora.errors import HoraError, PeerLostError, ProtocolError
from hora.ps.messages import Op

__all__ = [
    "MAX_HEADER",
    "MAX_NAME",
    "REPLY",
    "REPLY_MAGIC",
    "REQUEST",
    "REQUEST_MAGIC",
    "Reader",
    "error_of",
    "pack_request",
    "parse_header",
    "recv_header",
    "recv_payload",
    "recv_payload_into",
    "send_message",
    "send_parts",
]

#: Largest header frame (JSON) either side accepts.
MAX_HEADER = 1 << 20
#: Longest variable name (UTF-8 bytes) a hot request may carry.
MAX_NAME = 1024
#: magic, op code, name length, shard, rows, inline payload bytes, shared-memory payload bytes.
REQUEST = struct.Struct("<BBHIQQQ")
#: magic, status (0: ok), 0, 0, inline payload bytes, shared-memory payload bytes.
REPLY = struct.Struct("<BBHIQQ")
REQUEST_MAGIC, REPLY_MAGIC = 0xB1, 0xB2
_LEN = struct.Struct("!Q")
_SMALL = 1 << 16


def error_of(reply: dict[str, Any], what: str) -> HoraError:
    """The exception a server's JSON error reply stands for (its ``type``, when that is one of hora's)."""
    kind = getattr(errors, str(reply.get("type")), None)
    if not (isinstance(kind, type) and issubclass(kind, HoraError)):
        kind = errors.CollectiveError
    return kind(f"{what}: {reply.get('error')}")


def pack_request(op: Op, name: bytes, shard: int, rows: int = 0, nbytes: int = 0, shm: int = 0) -> bytes:
    """A hot request's header and name."""
    return REQUEST.pack(REQUEST_MAGIC, op.code, len(name), shard, rows, nbytes, shm) + name


def send_parts(
    sock: socket.socket, head: bytes, payload: Sequence[memoryview | bytes | np.ndarray] = ()
) -> None:
    """Send ``head`` and then ``payload``'s bytes: one syscall for small messages, no copy of large payloads."""
    views = [memoryview(p).cast("B") for p in payload]  # type: ignore[arg-type]
    if sum(v.nbytes for v in views) < _SMALL:
        sock.sendall(b"".join([head, *views]))
        return
    sock.sendall(head)
    for v in views:
        sock.sendall(v)


def send_message(
    sock: socket.socket, header: dict[str, Any], payload: Sequence[memoryview | bytes | np.ndarray] = ()
) -> None:
    """Send ``header`` (``nbytes`` is filled in) and the concatenation of ``payload`` as one frame, without
    copying large payloads."""
    views = [memoryview(p).cast("B") for p in payload]  # type: ignore[arg-type]
    total = sum(v.nbytes for v in views)
    header["nbytes"] = total
    head = json.dumps(header, separators=(",", ":")).encode()
    send_parts(sock, _LEN.pack(len(head)) + head + (_LEN.pack(total) if total else b""), views)


def parse_header(frame: bytes, what: str) -> dict[str, Any]:
    """A JSON header frame, parsed: an object with an integer ``nbytes`` >= 0."""
    try:
        header = json.loads(frame)
    except ValueError as exc:
        raise ProtocolError(f"{what} sent a header that is not JSON ({exc})") from None
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("nbytes", 0), int)
        or header.get("nbytes", 0) < 0
    ):
        raise ProtocolError(f"{what} sent a malformed header (not an object with a whole nbytes >= 0)")
    return header


def recv_header(sock: socket.socket, what: str) -> dict[str, Any]:
    """One header frame, parsed: a JSON object with an integer ``nbytes`` >= 0."""
    return parse_header(recv_frame(sock, MAX_HEADER, what), what)


def _expect(sock: socket.socket, n: int, what: str) -> None:
    (length,) = _LEN.unpack(recv_exact(sock, _LEN.size, what))
    if length != n:
        raise ProtocolError(
            f"{what} sent a payload of {length} bytes where {n} were due; dropping the connection"
        )


def recv_payload_into(sock: socket.socket, view: memoryview | np.ndarray, what: str) -> None:
    """Read a payload frame of exactly ``len(view)`` bytes straight into ``view`` (a C-contiguous array or buffer)."""
    mv = view.cast("B") if isinstance(view, memoryview) else memoryview(view).cast("B")  # type: ignore[arg-type]
    if mv.nbytes == 0:
        return
    _expect(sock, mv.nbytes, what)
    recv_into_exact(sock, mv, what)


def recv_payload(sock: socket.socket, n: int, what: str) -> np.ndarray:
    """A payload frame of exactly ``n`` bytes (checked before allocating), as a fresh uint8 array."""
    buf = np.empty(n, np.uint8)
    recv_payload_into(sock, buf, what)
    return buf


class Reader:
    """Buffered reads from one connection (the server's side): a small message costs one ``recv``; large payloads
    go straight from the socket into their destination."""

    def __init__(self, sock: socket.socket, what: str, size: int = 1 << 16) -> None:
        self.sock, self.what = sock, what
        self._buf = bytearray(size)
        self._mv = memoryview(self._buf)
        self._lo = self._hi = 0

    @property
    def buffered(self) -> int:
        return self._hi - self._lo

    def _fill(self, n: int) -> None:
        if self._hi - self._lo >= n:
            return
        if self._lo:
            k = self._hi - self._lo
            self._mv[:k] = self._mv[self._lo : self._hi]
            self._lo, self._hi = 0, k
        while self._hi < n:
            try:
                k = self.sock.recv_into(self._mv[self._hi :])
            except ConnectionError as exc:
                raise PeerLostError(f"connection to {self.what} was reset ({exc})") from exc
            if k == 0:
                raise PeerLostError(f"{self.what} closed the connection")
            self._hi += k

    def take(self, n: int) -> bytes:
        """Exactly ``n`` bytes (``n`` at most the buffer's size)."""
        self._fill(n)
        out = bytes(self._mv[self._lo : self._lo + n])
        self._lo += n
        return out

    def into(self, view: memoryview) -> None:
        """Fill ``view`` (bytes) from the buffer, then from the socket."""
        k = min(self._hi - self._lo, view.nbytes)
        view[:k] = self._mv[self._lo : self._lo + k]
        self._lo += k
        if k < view.nbytes:
            recv_into_exact(self.sock, view[k:], self.what)

    def skip(self, n: int) -> None:
        while n:
            k = min(n, len(self._buf))
            self._fill(k)
            self._lo += k
            n -= k

    def frame_after(self, head: bytes, limit: int) -> bytes:
        """The rest of a length-prefixed frame whose 8-byte length is ``head``; above ``limit`` raises first."""
        (length,) = _LEN.unpack(head)
        if length > limit:
            raise ProtocolError(
                f"{self.what} announced a frame of {length} bytes, above the limit of {limit}; dropping the connection"
            )
        if length <= len(self._buf):
            return self.take(length)
        buf = bytearray(length)
        self.into(memoryview(buf))
        return bytes(buf)

    def expect(self, n: int) -> None:
        """A payload frame's length, which must be ``n``."""
        (length,) = _LEN.unpack(self.take(_LEN.size))
        if length != n:
            raise ProtocolError(
                f"{self.what} sent a payload of {length} bytes where {n} were due; dropping the connection"
            )
