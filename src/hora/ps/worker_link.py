"""The server's side of one worker's connection: :class:`WorkerLink` (the worker's side of the same connection is
:class:`hora.ps.server_link.ServerLink`).

A link reads the worker's requests in order and answers each: it waits on the socket, or on the shared segment's
doorbell once the worker has one (:mod:`hora.ps.segment`); it serves a hot request (push, pull, push_pull,
push_rows, pull_rows) itself, with its payload read into a per-connection buffer or used in place in the segment
(or, single-copy, in the worker's own memory: :mod:`hora.ps.cma`) and its reply written from the same memory; it
turns a control header into its record (:func:`hora.ps.messages.parse_control`) and has the
:class:`~hora.ps.server.ParameterServer` handle it. Everything read from the socket or the segment is checked
before it is used (see :mod:`hora.ps.protocol`).
"""

from __future__ import annotations

import json
import select
import socket
from typing import TYPE_CHECKING, Any

import numpy as np

from hora._transport import futex
from hora.errors import HoraError, MismatchError, PeerLostError, ProtocolError
from hora.ps.cma import ADDRESSES, CMA_FLAG, RemoteMemory, connection_owners
from hora.ps.messages import OPS, AttachSegment, Op, SegmentReply, parse_control
from hora.ps.protocol import (
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
from hora.ps.segment import DATA, HEAD, REQ_WORD, SOCKET_CODE, Segment, spin_readable, spin_until

if TYPE_CHECKING:
    from hora.ps.server import ParameterServer
    from hora.ps.shard import Shard

__all__ = ["WorkerLink"]

_SLICE = 0.2  # seconds between checks of the socket while waiting on the doorbell
#: Seconds to poll for a worker's next request after serving one, before sleeping on the doorbell.
SPIN = 200e-6
_PUSHES = (Op.PUSH, Op.PUSH_PULL)


class WorkerLink:
    """Worker ``rank``'s connection to ``server``: its socket and reader, its shared segment, its payload buffer."""

    def __init__(self, server: ParameterServer, sock: socket.socket, rank: int) -> None:
        self.server = server
        self.sock, self.rank = sock, rank
        self.what = f"worker {rank}"
        self.reader = Reader(sock, self.what)
        self.segment: Segment | None = None
        self.remote: RemoteMemory | None = None  # the worker's memory, where the kernel lets us reach it
        self._announced = 0  # the current control request's payload bytes, as its header says
        self._payload_read = False  # whether they were read
        self._scratch = np.empty(0, np.uint8)

    def serve(self) -> None:
        """Answer the worker's requests until it leaves (a malformed request raises :class:`ProtocolError`)."""
        while True:
            try:
                header = self._next()
            except PeerLostError:
                return
            if header is not None:
                self._control(header)

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()

    # -- control requests ---------------------------------------------------------------------------------------
    def _control(self, header: dict[str, Any]) -> None:
        nbytes = header["nbytes"]
        if nbytes > self.server.max_bytes:
            raise ProtocolError(
                f"{self.what} announced a payload of {nbytes} bytes, above this server's limit"
            )
        self._announced, self._payload_read = nbytes, False  # on the wire until a handler reads it
        try:
            reply = self.server.handle(self, parse_control(header, self.what))
        except (HoraError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            if not self._payload_read and nbytes:
                self.reader.expect(nbytes)
                self.reader.skip(nbytes)
            send_message(self.sock, {"ok": False, "type": type(exc).__name__, "error": str(exc)})
            return
        send_message(self.sock, reply.header())

    def read_payload(self, due: int, name: str) -> np.ndarray:
        """The control request's ``due`` payload bytes (uint8), read from the socket into a fresh array; its header
        must have announced exactly that many (``name``: the variable, for the error)."""
        if self._announced != due:
            raise ProtocolError(f"{self.what} sent {self._announced} bytes for '{name}' (due: {due})")
        self._payload_read = True
        self.server.bytes_in += due
        buf = np.empty(due, np.uint8)
        if due:
            self.reader.expect(due)
            self.reader.into(memoryview(buf))  # type: ignore[arg-type]
        return buf

    def attach(self, request: AttachSegment) -> SegmentReply:
        """Map the worker's new segment (instead of its old one); grant single copy if the worker proves it owns
        it (:mod:`hora.ps.cma`)."""
        if self.segment is not None:
            self.segment.close()
            self.segment = None
        self.segment = Segment.attach(request.name, request.size)
        self.remote = None
        if request.pid is not None and request.token_at is not None:
            owners = connection_owners(self.sock)  # the grant is for the connected process's memory only
            if owners is not None and request.pid in owners:
                self.remote = RemoteMemory.verify(request.pid, request.token_at, self.segment.u8)
        return SegmentReply(self.remote is not None)

    # -- waiting for the next request ---------------------------------------------------------------------------
    def _next(self) -> dict[str, Any] | None:
        """Wait for the worker's next request. A hot one is served here (None); a control one is returned parsed."""
        if self.segment is not None and not self._doorbell():
            return None
        reader = self.reader
        if not reader.buffered:
            spin_readable(self.sock, SPIN)
        head = reader.take(8)
        if head[0] == REQUEST_MAGIC:
            fields = REQUEST.unpack(head + reader.take(REQUEST.size - 8))
            _, code, name_len, index, rows, nbytes, shm_bytes = fields
            if not 1 <= code <= len(OPS) or name_len > MAX_NAME or shm_bytes:
                raise ProtocolError(f"{self.what} sent a malformed request header")
            name = self._name(reader.take(name_len))
            self._serve_hot(OPS[code - 1], name, index, rows, nbytes, False)
            return None
        return parse_header(reader.frame_after(head, MAX_HEADER), self.what)

    def _name(self, raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what} sent a variable name that is not UTF-8") from None

    def _doorbell(self) -> bool:
        """Wait for the doorbell; serve a hot request from the segment (False), or say a control message is on
        the socket (True). Between waits, a closed socket means the worker is gone."""
        segment = self.segment
        assert segment is not None
        words, at = segment.words, REQ_WORD // 4
        spin_until(words, at, (segment.seq + 1) & 0xFFFFFFFF, SPIN)  # a busy worker's next request comes soon
        while True:
            seq = words[at]
            if seq != segment.seq:
                segment.seq = seq
                magic, code, name_len, index, rows, nbytes, shm_bytes = REQUEST.unpack_from(segment.mv, HEAD)
                if magic != REQUEST_MAGIC or name_len > MAX_NAME or nbytes:  # (copied out: checked as used)
                    raise ProtocolError(f"{self.what} rang with a malformed request header")
                if code == SOCKET_CODE:
                    return True
                single_copy = bool(code & CMA_FLAG) and self.remote is not None  # granted: hora.ps.cma
                if single_copy:
                    code &= ~CMA_FLAG
                if not 1 <= code <= len(OPS) or (single_copy and not OPS[code - 1].dense):
                    raise ProtocolError(f"{self.what} rang with unknown operation {code}")
                name = self._name(bytes(segment.mv[HEAD + REQUEST.size : HEAD + REQUEST.size + name_len]))
                self._serve_hot(OPS[code - 1], name, index, rows, shm_bytes, True, single_copy)
                return False
            futex.wait(segment.base + REQ_WORD, seq, _SLICE)
            idle = words[at] == seq and not self.reader.buffered
            if idle and select.select([self.sock], [], [], 0)[0] and not self.sock.recv(1, socket.MSG_PEEK):
                raise PeerLostError(f"{self.what} closed the connection")

    # -- hot requests -------------------------------------------------------------------------------------------
    def _scratch_bytes(self, n: int) -> np.ndarray:
        """A reused buffer of ``n`` bytes (grown when needed): no page faults per request."""
        if self._scratch.nbytes < n:
            self._scratch = np.empty(max(n, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch[:n]

    def _serve_hot(
        self,
        op: Op,
        name: str,
        index: int,
        rows: int,
        nbytes: int,
        via_segment: bool,
        single_copy: bool = False,
    ) -> None:
        """One hot request whose payload (``nbytes``) is next on the socket, or in the segment (``via_segment``),
        or in the worker's own memory (``single_copy``: the segment holds its addresses, :mod:`hora.ps.cma`)."""
        server, segment = self.server, self.segment
        in_segment = via_segment and not single_copy
        if nbytes > server.max_bytes or (in_segment and segment is not None and nbytes > segment.data.nbytes):
            raise ProtocolError(
                f"{self.what} announced a payload of {nbytes} bytes, above this server's limit"
            )
        try:
            shard = server.shard(name, index)
            if shard.poisoned:
                raise MismatchError(shard.poisoned)
            due = _due(shard, op, rows)
        except (HoraError, ValueError, KeyError) as exc:
            if not via_segment:
                self.reader.skip(nbytes)
            self._error(exc, via_segment)
            return
        if nbytes != due:
            raise ProtocolError(
                f"{self.what} sent {nbytes} bytes for {op} '{name}' shard {index} (due: {due})"
            )
        # distinct ids (checked below) cannot be more: bounds what is allocated next
        if rows > len(shard.value):
            raise ProtocolError(
                f"{self.what} asked for {rows} rows of '{name}' shard {index}, which has {len(shard.value)}"
            )
        region = segment.data if via_segment and segment is not None else None
        if region is None and not single_copy:
            need = rows * max(8, shard.row_bytes) if op is Op.PULL_ROWS else max(due, shard.value.nbytes)
            region = self._scratch_bytes(need if op is not Op.PUSH_ROWS else due)
            self.reader.into(memoryview(region[:due]))  # type: ignore[arg-type]
        server.bytes_in += due
        out: Any = None
        try:
            if single_copy:
                n = self._apply_remote(shard, op)
            else:
                assert region is not None
                out = self._apply(shard, op, region, rows)
                n = out.nbytes if out is not None else 0
        except (HoraError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            self._error(exc, via_segment)
            return
        server.bytes_out += n
        if via_segment and segment is not None:
            segment.answer(0, n)
        else:
            send_parts(self.sock, REPLY.pack(REPLY_MAGIC, 0, 0, 0, n, 0), [out] if n else [])

    def _apply(self, shard: Shard, op: Op, region: np.ndarray, rows: int) -> Any:
        """Run ``op``; returns the reply's payload (a view of ``region``) or None."""
        value, rank, timeout = shard.value, self.rank, self.server.op_timeout
        if op.dense:
            if region.nbytes < value.nbytes:
                raise ProtocolError(
                    f"{self.what}'s shared segment cannot hold shard {shard.index} of '{shard.name}'"
                )
            view = region[: value.nbytes].view(value.dtype).reshape(value.shape)
            if op is Op.PUSH:
                shard.push(rank, view)
                self._saved(shard)
                return None
            if op is Op.PUSH_PULL:
                shard.push_pull(rank, view, view, timeout)
                self._saved(shard)
            else:
                shard.read(rank, timeout, out=view)
            return region[: value.nbytes]
        if region.nbytes < rows * max(8, shard.row_bytes):
            raise ProtocolError(f"{self.what}'s shared segment cannot hold {rows} rows of '{shard.name}'")
        ids = region[: rows * 8].view("<i8").astype(np.intp)  # a copy: checked once, used as checked
        if rows and (ids.min() < 0 or ids.max() >= len(value)):
            raise ValueError(
                f"{op} '{shard.name}' shard {shard.index}: row ids out of range 0..{len(value) - 1}"
            )
        if op is Op.PULL_ROWS:
            if rows > 1 and not (np.diff(ids) > 0).all():
                raise ValueError(
                    f"pull_rows '{shard.name}': row ids must be sorted and distinct (the client dedups them)"
                )
            out = region[: rows * shard.row_bytes].view(value.dtype).reshape((rows, *value.shape[1:]))
            shard.read_rows(rank, ids, timeout, out=out)
            return region[: rows * shard.row_bytes]
        if rows > 1 and not (np.diff(ids) > 0).all() and len(np.unique(ids)) != rows:
            raise ValueError(f"push_rows '{shard.name}': row ids must be unique (the client sums duplicates)")
        grads = (
            region[rows * 8 : rows * (8 + shard.row_bytes)]
            .view(value.dtype)
            .reshape((rows, *value.shape[1:]))
        )
        shard.push(rank, (ids, grads))
        self._saved(shard)
        return None

    def _apply_remote(self, shard: Shard, op: Op) -> int:
        """Run dense ``op`` on the worker's own arrays, whose addresses are in the segment; returns the bytes
        written into the worker's result."""
        assert self.segment is not None and self.remote is not None
        # copied out: the worker cannot change them under us
        src, dst = ADDRESSES.unpack_from(self.segment.mv, DATA)
        if (op is not Op.PULL) != bool(src) or (op is not Op.PUSH) != bool(dst):
            raise ProtocolError(
                f"{self.what} sent a single-copy {op} of '{shard.name}' without its addresses"
            )
        remote, item = self.remote, shard.value.itemsize
        remote.check()
        fetch = (lambda lo, buf: remote.read(src + lo * item, buf)) if src else None
        deliver = (lambda lo, values: remote.write(dst + lo * item, values)) if dst else None
        shard.exchange_remote(self.rank, fetch, deliver, self.server.op_timeout)
        if src:
            self._saved(shard)
        return shard.value.nbytes if dst else 0

    def _saved(self, shard: Shard) -> None:
        """Count an applied update towards the shard's next checkpoint (``--max-restarts``, :mod:`hora.ps.autosave`)."""
        if self.server.saver is not None:
            self.server.saver.updated(shard)

    def _error(self, exc: BaseException, via_segment: bool) -> None:
        body = {"ok": False, "type": type(exc).__name__, "error": str(exc)}
        if via_segment and self.segment is not None:
            text = json.dumps(body).encode()[: self.segment.data.nbytes]
            self.segment.data[: len(text)] = np.frombuffer(text, np.uint8)
            self.segment.answer(1, len(text))
        else:
            send_message(self.sock, body)


def _due(shard: Shard, op: Op, rows: int) -> int:
    """The payload bytes a request must carry."""
    if op in _PUSHES:
        return shard.value.nbytes
    if op is Op.PUSH_ROWS:
        return rows * (8 + shard.row_bytes)
    return rows * 8 if op is Op.PULL_ROWS else 0
