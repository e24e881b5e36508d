"""The parameter-server wire format, spoken only after the handshake of :mod:`hora._runtime.auth` (role ``PS``).

A message is a JSON header frame (at most :data:`MAX_HEADER` bytes) and, when the header says ``"nbytes": n``
with ``n > 0``, one payload frame of exactly ``n`` bytes: raw array bytes (C order, the variable's dtype; row ids
as little-endian int64). The receiver knows how many bytes to expect from what it holds (the shard's shape, the
row count times the row size) and refuses any other length before reading or allocating it. Nothing is unpickled;
the header is plain JSON whose fields are checked by the receiver.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from hora._wire import recv_exact, recv_frame, recv_into_exact
from hora.errors import ProtocolError

__all__ = ["MAX_HEADER", "recv_header", "recv_payload", "recv_payload_into", "send_message"]

#: Largest header frame (JSON) either side accepts.
MAX_HEADER = 1 << 20
_LEN = struct.Struct("!Q")
_SMALL = 1 << 16


def send_message(sock: socket.socket, header: dict[str, Any], payload: Sequence[memoryview | bytes] = ()) -> None:
    """Send ``header`` (``nbytes`` is filled in) and the concatenation of ``payload`` as one frame, without
    copying large payloads."""
    views = [memoryview(p).cast("B") for p in payload]
    total = sum(v.nbytes for v in views)
    header["nbytes"] = total
    head = json.dumps(header, separators=(",", ":")).encode()
    parts: list[bytes | memoryview] = [_LEN.pack(len(head)), head]
    if total:
        parts.append(_LEN.pack(total))
        parts.extend(views)
    if total < _SMALL:
        sock.sendall(b"".join(parts))  # one syscall for the small messages (latency)
        return
    sock.sendall(b"".join(parts[:3]))
    for v in views:
        sock.sendall(v)


def recv_header(sock: socket.socket, what: str) -> dict[str, Any]:
    """One header frame, parsed: a JSON object with an integer ``nbytes`` >= 0."""
    frame = recv_frame(sock, MAX_HEADER, what)
    try:
        header = json.loads(frame)
    except ValueError as exc:
        raise ProtocolError(f"{what} sent a header that is not JSON ({exc})") from None
    if not isinstance(header, dict) or not isinstance(header.get("nbytes", 0), int) or header.get("nbytes", 0) < 0:
        raise ProtocolError(f"{what} sent a malformed header (not an object with a whole nbytes >= 0)")
    return header


def _expect(sock: socket.socket, n: int, what: str) -> None:
    (length,) = _LEN.unpack(recv_exact(sock, _LEN.size, what))
    if length != n:
        raise ProtocolError(f"{what} sent a payload of {length} bytes where {n} were due; dropping the connection")


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
