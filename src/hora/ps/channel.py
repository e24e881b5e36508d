"""The worker's side of the hot operations on one connection: over the socket, or through the shared segment
with its doorbell (:mod:`hora.ps.segment`). Each call sends one request and waits for its reply; the caller holds the
connection's lock. A refusal comes back as the server's JSON error object; a lost server raises."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hora._transport import futex
from hora._wire import recv_exact, recv_into_exact
from hora.errors import PeerLostError, ProtocolError
from hora.ps import cma
from hora.ps.cma import ADDRESSES, CMA_FLAG
from hora.ps.protocol import (
    DENSE_OPS,
    HOT_OPS,
    MAX_HEADER,
    REPLY,
    REPLY_MAGIC,
    REQUEST,
    REQUEST_MAGIC,
    pack_request,
    parse_header,
    send_parts,
)
from hora.ps.segment import (
    DATA,
    HEAD,
    REP_WORD,
    REPLY_AT,
    REQ_WORD,
    SOCKET_CODE,
    Segment,
    spin_readable,
    spin_until,
)

__all__ = ["announce", "hot_over_shm", "hot_over_tcp", "loopback", "ring_socket", "segment_need", "single_copy_fits"]

_LEN = struct.Struct("!Q")
_SLICE = 0.1  # seconds between checks for a lost server while waiting on the doorbell
#: Seconds to poll for a reply before sleeping on the doorbell (a small request's reply comes sooner).
SPIN = 200e-6
SPIN_BELOW = 1 << 20  # larger requests take longer than a spin: sleep at once
#: Bytes from which a dense request goes single-copy where it can: below, copying through the segment costs less
#: than the server's two system calls.
SINGLE_COPY_FROM = 1 << 18


def _views(payload: Sequence[Any]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in payload]


def _bytes(into: np.ndarray) -> memoryview:
    return memoryview(into).cast("B")  # type: ignore[arg-type]


def loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback address (where shared memory can replace the socket)."""
    return host.startswith("127.") or host in ("localhost", "::1")


def segment_need(payload: Sequence[Any], into: np.ndarray | None) -> int:
    """Bytes of segment (control block included) a request and its reply need."""
    return DATA + max(sum(p.nbytes for p in payload), into.nbytes if into is not None else 0)


def hot_over_tcp(
    sock: socket.socket, what: str, header: dict[str, Any], payload: Sequence[Any], into: np.ndarray | None
) -> dict[str, Any] | None:
    """Send a hot request with its payload, receive the reply into ``into``; the server's error object or None."""
    views = _views(payload)
    nbytes = sum(v.nbytes for v in views)
    head = pack_request(header["op"], header["name"].encode(), header["shard"], header.get("n", 0), nbytes)
    send_parts(sock, head, views)
    if nbytes < SPIN_BELOW:
        spin_readable(sock, SPIN)
    reply = recv_exact(sock, REPLY.size, what)
    if reply[0] != REPLY_MAGIC:  # a JSON error: its frame's length, then the first bytes of the frame
        (length,) = _LEN.unpack(reply[:8])
        if not REPLY.size - 8 < length <= MAX_HEADER:
            raise ProtocolError(f"{what} sent a malformed reply")
        error = parse_header(reply[8:] + recv_exact(sock, length - (REPLY.size - 8), what), what)
        if error["nbytes"] or error.get("ok"):
            raise ProtocolError(f"{what} sent a malformed error reply")
        return error
    _, status, _, _, n, shm = REPLY.unpack(reply)
    if status or shm or n != (into.nbytes if into is not None else 0):
        raise ProtocolError(f"{what} answered with {n} bytes where {into.nbytes if into is not None else 0} were due")
    if into is not None and n:
        recv_into_exact(sock, _bytes(into), what)
    return None


def ring_socket(shm: Segment) -> None:
    """Tell the server that a control message is on the socket."""
    _ring(shm, REQUEST_MAGIC, SOCKET_CODE, b"", 0, 0, 0)


def _ring(shm: Segment, magic: int, code: int, name: bytes, shard: int, rows: int, nbytes: int) -> None:
    REQUEST.pack_into(shm.mv, HEAD, magic, code, len(name), shard, rows, 0, nbytes)
    shm.mv[HEAD + REQUEST.size : HEAD + REQUEST.size + len(name)] = name
    shm.seq = (shm.seq + 1) & 0xFFFFFFFF
    shm.words[REQ_WORD // 4] = shm.seq
    futex.wake(shm.base + REQ_WORD)


def hot_over_shm(
    shm: Segment, sock: socket.socket, what: str, header: dict[str, Any], payload: Sequence[Any],
    into: np.ndarray | None, timeout: float, lost: Callable[[], str | None], direct: bool = False,
) -> dict[str, Any] | None:  # fmt: skip
    """The same through the segment (big enough: :func:`segment_need`): payload in, doorbell, wait, reply out.
    ``direct`` (:func:`single_copy_fits`): only the addresses of the arrays go in (:mod:`hora.ps.cma`)."""
    if direct:
        return _single_copy(shm, sock, what, header, payload, into, timeout, lost)
    offset = 0
    for v in _views(payload):
        end = offset + v.nbytes
        if v.nbytes < 1 << 16:  # small: a memoryview copy is cheaper; large: numpy's releases the GIL
            shm.mv[DATA + offset : DATA + end] = v
        else:
            shm.data[offset:end] = np.frombuffer(v, np.uint8)
        offset = end
    code = HOT_OPS.index(header["op"]) + 1
    _ring(shm, REQUEST_MAGIC, code, header["name"].encode(), header["shard"], header.get("n", 0), offset)
    if not spin_until(shm.words, REP_WORD // 4, shm.seq, SPIN):
        _await(shm, sock, what, timeout, lost)
    _, status, _, _, _, n = REPLY.unpack_from(shm.mv, REPLY_AT)
    if n > shm.data.nbytes:
        raise ProtocolError(f"{what} answered {n} shared bytes, more than the segment holds")
    if status:
        return _shm_error(shm, n, what)
    if n != (into.nbytes if into is not None else 0):
        raise ProtocolError(f"{what} answered {n} shared bytes where {into.nbytes if into is not None else 0} were due")
    if into is not None and n:
        np.copyto(into.reshape(-1).view(np.uint8), shm.data[:n])
    return None


def single_copy_fits(shm: Segment | None, header: dict[str, Any], payload: Sequence[Any], into: Any) -> bool:
    """Whether a request goes single-copy on ``shm``: granted there, dense, its arrays reachable in place (the
    result writable), and large enough for it to pay."""
    if shm is None or not shm.single_copy or header["op"] not in DENSE_OPS:
        return False
    arrays = [*payload, *([into] if into is not None else [])]
    return (
        all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
        and (into is None or into.flags.writeable)
        and max(a.nbytes for a in arrays) >= SINGLE_COPY_FROM
    )


def _single_copy(
    shm: Segment, sock: socket.socket, what: str, header: dict[str, Any], payload: Sequence[Any],
    into: np.ndarray | None, timeout: float, lost: Callable[[], str | None],
) -> dict[str, Any] | None:  # fmt: skip
    """The server reads ``payload[0]`` and writes ``into`` itself: only their addresses go into the segment."""
    src = int(payload[0].ctypes.data) if payload else 0
    dst = int(into.ctypes.data) if into is not None else 0
    ADDRESSES.pack_into(shm.mv, DATA, src, dst)
    code = (HOT_OPS.index(header["op"]) + 1) | CMA_FLAG
    nbytes = payload[0].nbytes if payload else 0
    _ring(shm, REQUEST_MAGIC, code, header["name"].encode(), header["shard"], 0, nbytes)
    _await(shm, sock, what, timeout, lost)  # large: no reply within a spin
    _, status, _, _, _, n = REPLY.unpack_from(shm.mv, REPLY_AT)
    if status:
        return _shm_error(shm, n, what)
    if n != (into.nbytes if into is not None else 0):
        raise ProtocolError(f"{what} wrote {n} bytes where {into.nbytes if into is not None else 0} were due")
    return None


def _shm_error(shm: Segment, n: int, what: str) -> dict[str, Any]:
    if n > shm.data.nbytes:
        raise ProtocolError(f"{what} answered {n} shared bytes, more than the segment holds")
    try:
        return dict(json.loads(bytes(shm.data[:n])))
    except ValueError:
        raise ProtocolError(f"{what} sent an error that is not JSON") from None


def announce(shm: Segment, single_copy: bool) -> dict[str, Any]:
    """The control message that hands a new segment to the server; with ``single_copy``, the pid and the address
    of a token in the segment, with which the server checks that it may read this process (:mod:`hora.ps.cma`)."""
    message: dict[str, Any] = {"op": "shm", "name": shm.name, "size": shm.size}
    if single_copy and cma.available():
        message.update(pid=os.getpid(), token_at=cma.new_token(shm.u8))
    return message


def _await(shm: Segment, sock: socket.socket, what: str, timeout: float, lost: Callable[[], str | None]) -> None:
    """Wait for the reply word to reach the request's count; between slices, a lost client or a closed socket (the
    server died) ends the wait."""
    deadline = time.monotonic() + timeout
    address, words = shm.address(REP_WORD), shm.words
    while True:
        word = words[REP_WORD // 4]
        if word == shm.seq:
            return
        futex.wait(address, word, _SLICE)
        if words[REP_WORD // 4] == shm.seq:
            return
        reason = lost()
        if reason is not None:
            raise PeerLostError(reason)
        try:
            if select.select([sock], [], [], 0)[0] and not sock.recv(1, socket.MSG_PEEK):
                raise PeerLostError(f"{what} closed the connection")
        except (OSError, ValueError) as exc:
            raise PeerLostError(f"connection to {what} failed ({exc})") from exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"no reply from {what} within {timeout:g}s")
