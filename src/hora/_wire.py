"""Reading and writing exact byte counts and length-prefixed frames: what every hora connection and pipe shares.

A frame is an 8-byte big-endian length, checked against a limit *before* anything is allocated, then the payload.
Socket helpers raise :class:`~hora.errors.PeerLostError` when the peer closes early; :func:`read_fully` serves
pipes and files, where a short read means end of stream and the caller decides what that means.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable

from hora.errors import PeerLostError, ProtocolError

__all__ = ["close_socket", "read_fd", "read_fully", "recv_exact", "recv_frame", "recv_into_exact", "send_frame"]

_LEN = struct.Struct("!Q")


def recv_into_exact(sock: socket.socket, view: memoryview, what: str = "peer") -> None:
    """Fill ``view`` from ``sock`` or raise :class:`PeerLostError` when the peer closes first."""
    got = 0
    n = len(view)
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except ConnectionError as exc:
            raise PeerLostError(f"connection to {what} was reset ({exc})") from exc
        if k == 0:
            raise PeerLostError(f"{what} closed the connection ({got} of {n} bytes received)")
        got += k


def recv_exact(sock: socket.socket, n: int, what: str = "peer") -> bytes:
    """Read exactly ``n`` bytes or raise :class:`PeerLostError` when the peer closes first."""
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf), what)
    return bytes(buf)


def send_frame(sock: socket.socket, payload: bytes | bytearray | memoryview) -> None:
    """Send one length-prefixed frame."""
    header = _LEN.pack(len(payload))
    if len(payload) < 65536:
        sock.sendall(header + bytes(payload))  # one syscall for the small control messages
    else:
        sock.sendall(header)
        sock.sendall(payload)


def recv_frame(sock: socket.socket, max_bytes: int, what: str = "peer") -> bytes:
    """Receive one frame; a length above ``max_bytes`` raises :class:`ProtocolError` before anything is allocated."""
    (length,) = _LEN.unpack(recv_exact(sock, _LEN.size, what))
    if length > max_bytes:
        raise ProtocolError(
            f"{what} announced a frame of {length} bytes, above the limit of {max_bytes} (HORA_MAX_FRAME_BYTES); "
            "dropping the connection"
        )
    return recv_exact(sock, length, what)


def read_fully(read: Callable[[int], bytes], n: int) -> bytes:
    """Call ``read(k)`` until ``n`` bytes arrived or it returns nothing (end of stream); returns what was read,
    shorter than ``n`` only at end of stream."""
    parts = []
    while n > 0:
        chunk = read(n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_fd(fd: int, n: int) -> bytes:
    """:func:`read_fully` on a file descriptor (pipes hand out at most what they hold: read in 1 MiB steps)."""
    return read_fully(lambda k: os.read(fd, min(k, 1 << 20)), n)


def close_socket(sock: socket.socket) -> None:
    """Shut both directions first (a thread blocked in recv on it wakes up), then close."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
