"""The server's side of the hot operations (push, pull, push_pull, push_rows, pull_rows): binary headers, payloads
read into a per-connection buffer or used in place in the shared segment, and replies written from the same memory.

:class:`Conn` is one worker's connection; :func:`next_request` waits for its next request (on the socket, or on the
shared segment's doorbell) and returns either a parsed JSON control header or None when it served a hot request
itself. Everything read from the socket or the segment is checked before it is used (see :mod:`hora.ps.protocol`).
"""

from __future__ import annotations

import json
import select
import socket
from typing import TYPE_CHECKING, Any

import numpy as np

from hora._transport import futex
from hora.errors import HoraError, MismatchError, PeerLostError, ProtocolError
from hora.ps.cma import ADDRESSES, CMA_FLAG, RemoteMemory
from hora.ps.protocol import (
    DENSE_OPS,
    HOT_OPS,
    MAX_HEADER,
    MAX_NAME,
    REPLY,
    REPLY_MAGIC,
    REQUEST,
    REQUEST_MAGIC,
    Reader,
    parse_header,
    send_message,
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

if TYPE_CHECKING:
    from hora.ps.server import ParameterServer
    from hora.ps.shard import Shard

__all__ = ["Conn", "next_request"]

_SLICE = 0.2  # seconds between checks of the socket while waiting on the doorbell
#: Seconds to poll for a worker's next request after serving one, before sleeping on the doorbell.
SPIN = 200e-6


class Conn:
    """One worker's connection: its socket and reader, its rank, its shared segment, its payload buffer."""

    def __init__(self, sock: socket.socket, rank: int) -> None:
        self.sock, self.rank = sock, rank
        self.what = f"worker {rank}"
        self.reader = Reader(sock, self.what)
        self.shm: Segment | None = None
        self.remote: RemoteMemory | None = None  # the worker's memory, where the kernel lets us reach it
        self.read = False  # whether the current JSON request's payload was read
        self._scratch = np.empty(0, np.uint8)

    def scratch(self, n: int) -> np.ndarray:
        """A reused buffer of ``n`` bytes (grown when needed): no page faults per request."""
        if self._scratch.nbytes < n:
            self._scratch = np.empty(max(n, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch[:n]


def next_request(server: ParameterServer, conn: Conn) -> dict[str, Any] | None:
    """Wait for the worker's next request. A hot one is served here (None); a control one is returned parsed."""
    if conn.shm is not None and not _doorbell(server, conn):
        return None
    if not conn.reader.buffered:
        spin_readable(conn.sock, SPIN)
    head = conn.reader.take(8)
    if head[0] == REQUEST_MAGIC:
        fields = REQUEST.unpack(head + conn.reader.take(REQUEST.size - 8))
        _, code, name_len, index, rows, nbytes, shm_bytes = fields
        if not 1 <= code <= len(HOT_OPS) or name_len > MAX_NAME or shm_bytes:
            raise ProtocolError(f"{conn.what} sent a malformed request header")
        name = _name(conn.reader.take(name_len), conn)
        _serve_hot(server, conn, HOT_OPS[code - 1], name, index, rows, nbytes, False)
        return None
    return parse_header(conn.reader.frame_after(head, MAX_HEADER), conn.what)


def _name(raw: bytes, conn: Conn) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"{conn.what} sent a variable name that is not UTF-8") from None


def _doorbell(server: ParameterServer, conn: Conn) -> bool:
    """Wait for the doorbell; serve a hot request from the segment (False), or say a control message is on the
    socket (True). Between waits, a closed socket means the worker is gone."""
    shm = conn.shm
    assert shm is not None
    words, at = shm.words, REQ_WORD // 4
    spin_until(words, at, (shm.seq + 1) & 0xFFFFFFFF, SPIN)  # a busy worker's next request comes soon
    while True:
        seq = words[at]
        if seq != shm.seq:
            shm.seq = seq
            magic, code, name_len, index, rows, nbytes, shm_bytes = REQUEST.unpack_from(shm.mv, HEAD)  # copied out
            if magic != REQUEST_MAGIC or name_len > MAX_NAME or nbytes:
                raise ProtocolError(f"{conn.what} rang with a malformed request header")
            if code == SOCKET_CODE:
                return True
            single_copy = bool(code & CMA_FLAG) and conn.remote is not None  # granted: hora.ps.cma
            if single_copy:
                code &= ~CMA_FLAG
            if not 1 <= code <= len(HOT_OPS) or (single_copy and HOT_OPS[code - 1] not in DENSE_OPS):
                raise ProtocolError(f"{conn.what} rang with unknown operation {code}")
            name = _name(bytes(shm.mv[HEAD + REQUEST.size : HEAD + REQUEST.size + name_len]), conn)
            _serve_hot(server, conn, HOT_OPS[code - 1], name, index, rows, shm_bytes, True, single_copy)
            return False
        futex.wait(shm.base + REQ_WORD, seq, _SLICE)
        idle = words[at] == seq and not conn.reader.buffered
        if idle and select.select([conn.sock], [], [], 0)[0] and not conn.sock.recv(1, socket.MSG_PEEK):
            raise PeerLostError(f"{conn.what} closed the connection")


def _due(shard: Shard, op: str, rows: int) -> int:
    if op in ("push", "push_pull"):
        return shard.value.nbytes
    if op == "push_rows":
        return rows * (8 + shard.row_bytes)
    return rows * 8 if op == "pull_rows" else 0


def _serve_hot(
    server: ParameterServer, conn: Conn, op: str, name: str, index: int, rows: int, nbytes: int, via_shm: bool,
    single_copy: bool = False,
) -> None:  # fmt: skip
    """One hot request whose payload (``nbytes``) is next on the socket, or in the segment (``via_shm``), or in
    the worker's own memory (``single_copy``: the segment holds its addresses, :mod:`hora.ps.cma`)."""
    in_segment = via_shm and not single_copy
    if nbytes > server.max_bytes or (in_segment and conn.shm is not None and nbytes > conn.shm.data.nbytes):
        raise ProtocolError(f"{conn.what} announced a payload of {nbytes} bytes, above this server's limit")
    try:
        shard = server.shard(name, index)
        if shard.poisoned:
            raise MismatchError(shard.poisoned)
        due = _due(shard, op, rows)
    except (HoraError, ValueError, KeyError) as exc:
        if not via_shm:
            conn.reader.skip(nbytes)
        _error(conn, exc, via_shm)
        return
    if nbytes != due:
        raise ProtocolError(f"{conn.what} sent {nbytes} bytes for {op} '{name}' shard {index} (due: {due})")
    if rows > len(shard.value):  # distinct ids (checked below) cannot be more: bounds what is allocated next
        raise ProtocolError(f"{conn.what} asked for {rows} rows of '{name}' shard {index}, which has {len(shard.value)}")
    region = conn.shm.data if via_shm and conn.shm is not None else None
    if region is None and not single_copy:
        need = rows * max(8, shard.row_bytes) if op == "pull_rows" else max(due, shard.value.nbytes)
        region = conn.scratch(need if op != "push_rows" else due)
        conn.reader.into(memoryview(region[:due]))  # type: ignore[arg-type]
    server.bytes_in += due
    out: Any = None
    try:
        if single_copy:
            n = _apply_remote(server, conn, shard, op)
        else:
            assert region is not None
            out = _apply(server, conn, shard, op, region, rows)
            n = out.nbytes if out is not None else 0
    except (HoraError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        _error(conn, exc, via_shm)
        return
    server.bytes_out += n
    if via_shm and conn.shm is not None:
        _ring_reply(conn.shm, 0, n)
    else:
        send_parts(conn.sock, REPLY.pack(REPLY_MAGIC, 0, 0, 0, n, 0), [out] if n else [])


def _apply(server: ParameterServer, conn: Conn, shard: Shard, op: str, region: np.ndarray, rows: int) -> Any:
    """Run ``op``; returns the reply's payload (a view of ``region``) or None."""
    value, rank, timeout = shard.value, conn.rank, server.op_timeout
    if op in ("push", "push_pull", "pull"):
        if region.nbytes < value.nbytes:
            raise ProtocolError(f"{conn.what}'s shared segment cannot hold shard {shard.index} of '{shard.name}'")
        view = region[: value.nbytes].view(value.dtype).reshape(value.shape)
        if op == "push":
            shard.push(rank, view)
            _saved(server, shard)
            return None
        if op == "push_pull":
            shard.push_pull(rank, view, view, timeout)
            _saved(server, shard)
        else:
            shard.read(rank, timeout, out=view)
        return region[: value.nbytes]
    if region.nbytes < rows * max(8, shard.row_bytes):
        raise ProtocolError(f"{conn.what}'s shared segment cannot hold {rows} rows of '{shard.name}'")
    ids = region[: rows * 8].view("<i8").astype(np.intp)  # a copy: checked once, used as checked
    if rows and (ids.min() < 0 or ids.max() >= len(value)):
        raise ValueError(f"{op} '{shard.name}' shard {shard.index}: row ids out of range 0..{len(value) - 1}")
    if op == "pull_rows":
        if rows > 1 and not (np.diff(ids) > 0).all():
            raise ValueError(f"pull_rows '{shard.name}': row ids must be sorted and distinct (the client dedups them)")
        out = region[: rows * shard.row_bytes].view(value.dtype).reshape((rows, *value.shape[1:]))
        shard.read_rows(rank, ids, timeout, out=out)
        return region[: rows * shard.row_bytes]
    if rows > 1 and not (np.diff(ids) > 0).all() and len(np.unique(ids)) != rows:
        raise ValueError(f"push_rows '{shard.name}': row ids must be unique (the client sums duplicates)")
    grads = region[rows * 8 : rows * (8 + shard.row_bytes)].view(value.dtype).reshape((rows, *value.shape[1:]))
    shard.push(rank, (ids, grads))
    _saved(server, shard)
    return None


def _apply_remote(server: ParameterServer, conn: Conn, shard: Shard, op: str) -> int:
    """Run dense ``op`` on the worker's own arrays, whose addresses are in the segment; returns the bytes written
    into the worker's result."""
    assert conn.shm is not None and conn.remote is not None
    src, dst = ADDRESSES.unpack_from(conn.shm.mv, DATA)  # copied out: the worker cannot change them under us
    if (op != "pull") != bool(src) or (op != "push") != bool(dst):
        raise ProtocolError(f"{conn.what} sent a single-copy {op} of '{shard.name}' without its addresses")
    remote, item = conn.remote, shard.value.itemsize
    remote.check()
    fetch = (lambda lo, buf: remote.read(src + lo * item, buf)) if src else None
    deliver = (lambda lo, values: remote.write(dst + lo * item, values)) if dst else None
    shard.exchange_remote(conn.rank, fetch, deliver, server.op_timeout)
    if src:
        _saved(server, shard)
    return shard.value.nbytes if dst else 0


def _saved(server: ParameterServer, shard: Shard) -> None:
    """Count an applied update towards the shard's next checkpoint (``--max-restarts``, :mod:`hora.ps.autosave`)."""
    if server.saver is not None:
        server.saver.updated(shard)


def _ring_reply(shm: Segment, status: int, n: int) -> None:
    REPLY.pack_into(shm.mv, REPLY_AT, REPLY_MAGIC, status, 0, 0, 0, n)
    shm.words[REP_WORD // 4] = shm.seq
    futex.wake(shm.base + REP_WORD)


def _error(conn: Conn, exc: BaseException, via_shm: bool) -> None:
    body = {"ok": False, "type": type(exc).__name__, "error": str(exc)}
    if via_shm and conn.shm is not None:
        text = json.dumps(body).encode()[: conn.shm.data.nbytes]
        conn.shm.data[: len(text)] = np.frombuffer(text, np.uint8)
        _ring_reply(conn.shm, 1, len(text))
    else:
        send_message(conn.sock, body)
