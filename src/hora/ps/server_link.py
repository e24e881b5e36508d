"""The worker's side of one connection to a parameter server: :class:`ServerLink` (the server's side of the same
connection is :class:`hora.ps.worker_link.WorkerLink`).

A link owns the authenticated socket, the lock that keeps one request at a time on it, and the shared segment with
its doorbell (:mod:`hora.ps.segment`) when the server is on this host. It sends the requests of
:mod:`hora.ps.messages` in order and waits for each reply: a hot request over the socket, through the segment, or
single-copy (:mod:`hora.ps.cma`: only the arrays' addresses go into the segment); a control request as a JSON
header on the socket. A refusal comes back as the server's error (:class:`Refusal`); a lost server raises
(``OSError``, :class:`PeerLostError`, :class:`ProtocolError`), and the :class:`~hora.ps.client.Client` decides
what that means for the others.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hora import errors
from hora._runtime.auth import Role
from hora._runtime.rendezvous import connect_with_retry
from hora._transport import futex
from hora._wire import close_socket, recv_exact, recv_into_exact
from hora.errors import HoraError, PeerLostError, ProtocolError
from hora.ps import cma
from hora.ps.cma import ADDRESSES, CMA_FLAG
from hora.ps.messages import AttachSegment, ControlRequest, HotRequest, Reply, SegmentReply
from hora.ps.protocol import (
    MAX_HEADER,
    REPLY,
    REPLY_MAGIC,
    pack_request,
    parse_header,
    recv_header,
    send_message,
    send_parts,
)
from hora.ps.segment import DATA, REP_WORD, REPLY_AT, SOCKET_CODE, Segment, spin_readable, spin_until

__all__ = ["Lost", "OnReply", "Refusal", "ServerLink", "announce", "loopback"]

log = logging.getLogger(__name__)

_LEN = struct.Struct("!Q")
_SLICE = 0.1  # seconds between checks for a lost server while waiting on the doorbell
#: Seconds to poll for a reply before sleeping on the doorbell (a small request's reply comes sooner).
SPIN = 200e-6
SPIN_BELOW = 1 << 20  # larger requests take longer than a spin: sleep at once
#: Bytes from which a dense request goes single-copy where it can: below, copying through the segment costs less
#: than the server's two system calls.
SINGLE_COPY_FROM = 1 << 18

#: Why the client is broken (another server was lost), or None: a wait on the doorbell ends when it is not None.
Lost = Callable[[], "str | None"]
#: Called with each control request's reply (of the request's kind of :class:`~hora.ps.messages.Reply`).
OnReply = Callable[[Reply], None]


@dataclass(frozen=True)
class Refusal:
    """A server's answer that it did not do a request (the connection is fine): its exception's name and text."""

    type: str
    error: str

    @classmethod
    def of(cls, reply: dict[str, Any]) -> Refusal:
        return cls(str(reply.get("type")), str(reply.get("error")))

    def exception(self, what: str) -> HoraError:
        """The exception it stands for (its ``type``, when that is one of hora's)."""
        kind = getattr(errors, self.type, None)
        if not (isinstance(kind, type) and issubclass(kind, HoraError)):
            kind = errors.CollectiveError
        return kind(f"{what}: {self.error}")


def loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback address (where shared memory can replace the socket)."""
    return host.startswith("127.") or host in ("localhost", "::1")


def announce(segment: Segment, single_copy: bool) -> AttachSegment:
    """The request that hands a new segment to the server; with ``single_copy``, the pid and the address of a
    token in the segment, with which the server checks that it may read this process (:mod:`hora.ps.cma`)."""
    if single_copy and cma.available():
        return AttachSegment(segment.name, segment.size, os.getpid(), cma.new_token(segment.u8))
    return AttachSegment(segment.name, segment.size)


def _views(payload: Sequence[Any]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in payload]


def _due(into: np.ndarray | None) -> int:
    return into.nbytes if into is not None else 0


class ServerLink:
    """This worker's connection to server ``index`` at ``address``.

    Args:
        sock: the authenticated socket (:meth:`open`).
        use_segment: move payloads through a shared segment (the server is on this host).
        single_copy: ask the server for single copy when it maps a segment.
        reply_timeout: seconds to wait for a reply through the segment.
    """

    def __init__(
        self,
        index: int,
        address: tuple[str, int],
        sock: socket.socket,
        use_segment: bool,
        single_copy: bool,
        reply_timeout: float,
    ) -> None:
        self.index = index
        self.address = address
        self.sock = sock
        self.lock = threading.Lock()  # one request at a time; the client holds it around run()
        self.use_segment = use_segment  # False from the first time a segment could not be made
        self.single_copy = single_copy
        self.reply_timeout = reply_timeout
        self.segment: Segment | None = None

    @classmethod
    def open(
        cls,
        index: int,
        address: tuple[str, int],
        secret: bytes,
        rank: int,
        deadline: float,
        io_timeout: float,
        use_segment: bool,
        single_copy: bool,
    ) -> ServerLink:
        """Connect and authenticate as worker ``rank`` (retrying until ``deadline``)."""
        sock = connect_with_retry(*address, secret, Role.PS, rank, deadline, f"parameter server {index}")
        sock.settimeout(io_timeout)
        return cls(index, address, sock, use_segment, single_copy, io_timeout)

    @property
    def what(self) -> str:
        return f"parameter server {self.index} at {self.address[0]}:{self.address[1]}"

    def run(
        self, requests: Sequence[HotRequest | ControlRequest], on_reply: OnReply | None, lost: Lost
    ) -> Refusal | None:
        """Send ``requests`` in order, each after the previous one's reply; the first refusal ends the run and is
        returned (the connection is fine). The caller holds :attr:`lock`."""
        for request in requests:
            refusal = self.hot(request, lost) if isinstance(request, HotRequest) else self.control(request, on_reply)
            if refusal is not None:
                return refusal
        return None

    def control(self, request: ControlRequest, on_reply: OnReply | None = None) -> Refusal | None:
        """A control request and its reply, on the socket."""
        if self.segment is not None:  # first: the server must read while a large payload is sent
            self.ring_socket()
        send_message(self.sock, request.header(), request.payload())
        reply = recv_header(self.sock, self.what)
        if not reply.get("ok"):
            return Refusal.of(reply)
        if reply["nbytes"]:
            raise ProtocolError(f"{self.what} sent an unexpected payload")
        if on_reply is not None:
            on_reply(self._parse(request.reply, reply, request.op))
        return None

    def _parse(self, kind: type[Reply], reply: dict[str, Any], op: str) -> Reply:
        try:
            return kind.parse(reply)
        except (KeyError, ValueError, TypeError) as exc:
            raise ProtocolError(f"{self.what} sent a malformed reply to {op} ({exc!r})") from None

    def hot(self, request: HotRequest, lost: Lost) -> Refusal | None:
        """One push/pull/rows request, through shared memory where there is some."""
        payload, into = request.payload, request.into
        need, segment = DATA + max(sum(p.nbytes for p in payload), _due(into)), self.segment
        direct = self._single_copy_fits(request)  # only addresses go into the segment: it need not grow
        if self.use_segment and not direct:
            segment = self._segment(need)
        if segment is not None and (direct or segment.size >= need):
            return self._over_segment(segment, request, lost, direct)
        if segment is not None:
            # it could not grow: the server waits on its doorbell, so ring before using the socket
            self.ring_socket()
        return self._over_tcp(request)

    def ring_socket(self) -> None:
        """Tell the server (waiting on the doorbell) that a control message is on the socket."""
        assert self.segment is not None
        self.segment.ring(SOCKET_CODE)

    # -- the socket ---------------------------------------------------------------------------------------------
    def _over_tcp(self, request: HotRequest) -> Refusal | None:
        """Send the request with its payload, receive the reply into ``into``."""
        sock, what, into = self.sock, self.what, request.into
        views = _views(request.payload)
        nbytes = sum(v.nbytes for v in views)
        send_parts(
            sock, pack_request(request.op, request.name.encode(), request.shard, request.rows, nbytes), views
        )
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
            return Refusal.of(error)
        _, status, _, _, n, shm = REPLY.unpack(reply)
        if status or shm or n != _due(into):
            raise ProtocolError(f"{what} answered with {n} bytes where {_due(into)} were due")
        if into is not None and n:
            recv_into_exact(sock, memoryview(into).cast("B"), what)  # type: ignore[arg-type]
        return None

    # -- the segment --------------------------------------------------------------------------------------------
    def _segment(self, need: int) -> Segment | None:
        """The shared segment, created or grown to ``need`` bytes first (announced on the socket); None, or the
        old one too small, when there is no room in /dev/shm (the socket carries what does not fit from then on)."""
        segment = self.segment
        if segment is not None and segment.size >= need:
            return segment
        try:
            new = Segment.create(max(need, 1 << 20, 2 * segment.size if segment else 0))
        except OSError as exc:
            log.warning(
                "parameter server %d: no shared memory for %d bytes (%s); using TCP", self.index, need, exc
            )
            self.use_segment = False
            return segment
        try:
            if segment is not None:
                self.ring_socket()
            send_message(self.sock, announce(new, self.single_copy).header())
            reply = recv_header(self.sock, self.what)
        finally:
            new.unlink()  # mapped by both (or refused): nothing is left in /dev/shm either way
        if not reply.get("ok"):
            new.close()
            raise Refusal.of(reply).exception(self.what)
        attached = self._parse(SegmentReply, reply, AttachSegment.op)
        assert isinstance(attached, SegmentReply)
        new.single_copy = attached.single_copy
        if segment is not None:
            segment.close()
        self.segment = new
        return new

    def _single_copy_fits(self, request: HotRequest) -> bool:
        """Whether the request goes single-copy: granted on the segment, dense, its arrays reachable in place (the
        result writable), and large enough for it to pay."""
        segment, into = self.segment, request.into
        if segment is None or not segment.single_copy or not request.op.dense:
            return False
        arrays = [*request.payload, *([into] if into is not None else [])]
        return (
            all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
            and (into is None or into.flags.writeable)
            and max(a.nbytes for a in arrays) >= SINGLE_COPY_FROM
        )

    def _over_segment(
        self, segment: Segment, request: HotRequest, lost: Lost, direct: bool
    ) -> Refusal | None:
        """Payload into the segment (big enough), doorbell, wait, reply out of it. ``direct``: only the addresses
        of the arrays go in, and the server reads and writes them itself (:mod:`hora.ps.cma`)."""
        payload, into, what = request.payload, request.into, self.what
        if direct:
            src = int(payload[0].ctypes.data) if payload else 0
            dst = int(into.ctypes.data) if into is not None else 0
            ADDRESSES.pack_into(segment.mv, DATA, src, dst)
            nbytes = payload[0].nbytes if payload else 0
            segment.ring(request.op.code | CMA_FLAG, request.name.encode(), request.shard, 0, nbytes)
            self._await(segment, lost)  # large: no reply within a spin
        else:
            offset = 0
            for v in _views(payload):
                end = offset + v.nbytes
                if v.nbytes < 1 << 16:  # small: a memoryview copy is cheaper; large: numpy's releases the GIL
                    segment.mv[DATA + offset : DATA + end] = v
                else:
                    segment.data[offset:end] = np.frombuffer(v, np.uint8)
                offset = end
            segment.ring(request.op.code, request.name.encode(), request.shard, request.rows, offset)
            if not spin_until(segment.words, REP_WORD // 4, segment.seq, SPIN):
                self._await(segment, lost)
        _, status, _, _, _, n = REPLY.unpack_from(segment.mv, REPLY_AT)
        if status:
            if n > segment.data.nbytes:
                raise ProtocolError(f"{what} answered {n} shared bytes, more than the segment holds")
            try:
                return Refusal.of(dict(json.loads(bytes(segment.data[:n]))))
            except ValueError:
                raise ProtocolError(f"{what} sent an error that is not JSON") from None
        # the request's own size: it fits the segment, unless single copy wrote it in place
        if n != _due(into):
            raise ProtocolError(f"{what} answered {n} bytes where {_due(into)} were due")
        if into is not None and n and not direct:
            np.copyto(into.reshape(-1).view(np.uint8), segment.data[:n])
        return None

    def _await(self, segment: Segment, lost: Lost) -> None:
        """Wait for the reply word to reach the request's count; between slices, a broken client or a closed
        socket (the server died) ends the wait."""
        deadline = time.monotonic() + self.reply_timeout
        address, words, sock = segment.address(REP_WORD), segment.words, self.sock
        while True:
            word = words[REP_WORD // 4]
            if word == segment.seq:
                return
            futex.wait(address, word, _SLICE)
            if words[REP_WORD // 4] == segment.seq:
                return
            reason = lost()
            if reason is not None:
                raise PeerLostError(reason)
            try:
                if select.select([sock], [], [], 0)[0] and not sock.recv(1, socket.MSG_PEEK):
                    raise PeerLostError(f"{self.what} closed the connection")
            except (OSError, ValueError) as exc:
                raise PeerLostError(f"connection to {self.what} failed ({exc})") from exc
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply from {self.what} within {self.reply_timeout:g}s")

    # -- the connection's life ----------------------------------------------------------------------------------
    def replace(self, sock: socket.socket, address: tuple[str, int]) -> None:
        """Go on with a new connection (to the server's restart, :mod:`hora.ps.reconnect`): the new process never
        mapped the old segment."""
        self.drop()  # done already when the wait for the restart began
        sock.settimeout(self.reply_timeout)
        self.sock, self.address = sock, address

    def drop(self) -> None:
        """Close the socket and the segment (the server is gone)."""
        close_socket(self.sock)
        if self.segment is not None:
            self.segment.close()
            self.segment = None

    def shutdown(self) -> None:
        """End any request in flight on this connection now (the client is broken)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        """Ring (when no request is in flight: the server then reads the socket, finds it closed and counts this
        worker gone at once), then close the socket and the segment."""
        if self.segment is not None and self.lock.acquire(blocking=False):
            try:
                self.ring_socket()
            finally:
                self.lock.release()
        self.drop()
