"""The challenge-response handshake and length-checked framing, over socketpairs (one side in a thread)."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hora._runtime.auth import MAGIC, VERSION, Role, client_handshake, new_secret, server_handshake
from hora._wire import recv_exact, recv_frame, send_frame
from hora.errors import AuthenticationError, HoraError, PeerLostError, ProtocolError

SECRET = bytes(range(32))
HANG = 5.0  # generous: only there so that a bug becomes a failure instead of a stuck test
HELLO_SIZE = 4 + 1 + 32
CLIENT_SIZE = 4 + 1 + 1 + 4 + 32 + 32


class Side:
    """Run ``fn`` in a thread; ``result()`` returns its value or re-raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:
            self._error = exc

    def result(self) -> Any:
        self._thread.join(HANG)
        assert not self._thread.is_alive(), "the other side of the handshake hung"
        if self._error is not None:
            raise self._error
        return self._value


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(HANG)
    b.settimeout(HANG)
    yield a, b
    a.close()
    b.close()


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def test_new_secret():
    s1, s2 = new_secret(), new_secret()
    assert len(s1) == 32 and s1 != s2


# -- handshake ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", list(Role))
def test_successful_handshake_returns_role_and_rank(pair, role):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, timeout=HANG))
    client_handshake(client_sock, SECRET, role, 5, timeout=HANG)
    assert server.result() == (role, 5)
    # both sockets get their previous timeout back and still carry data
    assert server_sock.gettimeout() == HANG and client_sock.gettimeout() == HANG
    client_sock.sendall(b"after")
    assert recv_exact(server_sock, 5) == b"after"


def test_handshake_with_allowed_roles(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, HANG, roles=(Role.CONTROL, Role.DATA)))
    client_handshake(client_sock, SECRET, Role.DATA, 0, timeout=HANG)
    assert server.result() == (Role.DATA, 0)


def test_wrong_secret_fails_on_both_sides(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, timeout=HANG))
    with pytest.raises(AuthenticationError, match="the server rejected this process's credentials"):
        client_handshake(client_sock, b"x" * 32, Role.CONTROL, 1, timeout=HANG)
    with pytest.raises(
        AuthenticationError, match=r"a client failed authentication \(wrong secret or another job\)"
    ):
        server.result()


def test_role_not_served_is_rejected(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, HANG, roles=(Role.RENDEZVOUS,)))
    with pytest.raises(AuthenticationError, match="rejected"):
        client_handshake(client_sock, SECRET, Role.DATA, 1, timeout=HANG)
    with pytest.raises(
        AuthenticationError, match=r"a client asked for role 3, which this server does not serve"
    ):
        server.result()


def test_unknown_role_value_is_rejected(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, HANG))
    with pytest.raises(AuthenticationError):
        client_handshake(client_sock, SECRET, 9, 1, timeout=HANG)  # type: ignore[arg-type]
    with pytest.raises(AuthenticationError, match="role 9"):
        server.result()


def test_garbage_from_client_is_a_protocol_error(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, timeout=HANG))
    recv_exact(client_sock, HELLO_SIZE)
    client_sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".ljust(CLIENT_SIZE, b"\0"))
    with pytest.raises(ProtocolError, match="a client sent bytes that are not a hora handshake"):
        server.result()


def test_hora_magic_with_wrong_version_from_client(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, timeout=HANG))
    recv_exact(client_sock, HELLO_SIZE)
    client_sock.sendall(struct.pack("!4sBBi32s32s", MAGIC, VERSION + 1, 2, 0, b"n" * 32, b"m" * 32))
    with pytest.raises(ProtocolError, match="not a hora handshake"):
        server.result()


def test_short_garbage_then_close_is_a_protocol_error(pair):
    server_sock, client_sock = pair
    server = Side(lambda: server_handshake(server_sock, SECRET, timeout=HANG))
    client_sock.sendall(b"\x16\x03\x01garbage")
    client_sock.shutdown(socket.SHUT_WR)
    with pytest.raises(
        ProtocolError, match=r"a client left during the handshake .*\(10 of 74 bytes received\)"
    ):
        server.result()


def test_short_garbage_then_silence_times_out(pair):
    server_sock, client_sock = pair
    client_sock.sendall(b"\x00\x01\x02")
    start = time.monotonic()
    with pytest.raises(AuthenticationError, match=r"did not complete the handshake within 0.2s"):
        server_handshake(server_sock, SECRET, timeout=0.2)
    assert time.monotonic() - start < HANG
    assert server_sock.gettimeout() == HANG


def test_silent_client_times_out(pair):
    server_sock, _ = pair
    start = time.monotonic()
    with pytest.raises(AuthenticationError, match=r"a client did not complete the handshake within 0.2s"):
        server_handshake(server_sock, SECRET, timeout=0.2)
    assert time.monotonic() - start < HANG


def test_silent_server_times_out(pair):
    _, client_sock = pair
    with pytest.raises(AuthenticationError, match=r"handshake with the server timed out after 0.2s"):
        client_handshake(client_sock, SECRET, Role.CONTROL, 0, timeout=0.2)


def test_fake_server_wrong_magic(pair):
    fake, client_sock = pair
    fake.sendall(struct.pack("!4sB32s", b"SSH-", VERSION, os.urandom(32)))
    with pytest.raises(ProtocolError, match=r"the server is not a hora server \(bad magic in its greeting\)"):
        client_handshake(client_sock, SECRET, Role.CONTROL, 0, timeout=HANG)


def test_fake_server_wrong_version(pair):
    fake, client_sock = pair
    fake.sendall(struct.pack("!4sB32s", MAGIC, 7, os.urandom(32)))
    with pytest.raises(
        ProtocolError, match=rf"the server speaks hora protocol 7, this process speaks {VERSION}"
    ):
        client_handshake(client_sock, SECRET, Role.CONTROL, 0, timeout=HANG)


def test_fake_server_that_cannot_prove_the_secret(pair):
    fake, client_sock = pair

    def impostor() -> None:
        fake.sendall(struct.pack("!4sB32s", MAGIC, VERSION, os.urandom(32)))
        recv_exact(fake, CLIENT_SIZE)  # accepts anything, as a squatter would
        fake.sendall(b"\x01" + os.urandom(32))

    side = Side(impostor)
    with pytest.raises(AuthenticationError, match="the server could not prove it knows the job secret"):
        client_handshake(client_sock, SECRET, Role.CONTROL, 0, timeout=HANG)
    side.result()


def test_fake_server_replaying_the_client_proof(pair):
    """A server that echoes the client's own MAC (computed with "c") must not pass for one that knows the secret."""
    fake, client_sock = pair

    def impostor() -> None:
        fake.sendall(struct.pack("!4sB32s", MAGIC, VERSION, os.urandom(32)))
        data = recv_exact(fake, CLIENT_SIZE)
        fake.sendall(b"\x01" + data[-32:])

    side = Side(impostor)
    with pytest.raises(AuthenticationError, match="could not prove"):
        client_handshake(client_sock, SECRET, Role.CONTROL, 0, timeout=HANG)
    side.result()


def test_fake_server_that_closes_mid_greeting(pair):
    fake, client_sock = pair
    fake.sendall(MAGIC)
    fake.close()
    with pytest.raises(HoraError, match="closed the connection"):
        client_handshake(client_sock, SECRET, Role.CONTROL, 0, timeout=HANG)


def test_server_proof_is_bound_to_the_nonces(pair):
    """The server's answer is HMAC(secret, "s" | cn | sn | role | rank): checked against an independent computation."""
    fake, client_sock = pair
    server_nonce = os.urandom(32)

    def honest_by_hand() -> None:
        fake.sendall(struct.pack("!4sB32s", MAGIC, VERSION, server_nonce))
        _, _, role, rank, cn, proof = struct.unpack("!4sBBi32s32s", recv_exact(fake, CLIENT_SIZE))
        ident = struct.pack("!Bi", role, rank)
        assert proof == _mac(SECRET, b"c", server_nonce, cn, ident)
        fake.sendall(b"\x01" + _mac(SECRET, b"s", cn, server_nonce, ident))

    side = Side(honest_by_hand)
    client_handshake(client_sock, SECRET, Role.RENDEZVOUS, 3, timeout=HANG)
    side.result()


# -- framing ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 100, 65535, 65536, 300_000])
def test_frame_round_trip(pair, size):
    a, b = pair
    payload = os.urandom(size)
    sender = Side(lambda: send_frame(a, payload))  # large frames exceed the socket buffer: send concurrently
    assert recv_frame(b, max_bytes=1 << 20) == payload
    sender.result()


def test_frame_round_trip_memoryview_and_bytearray(pair):
    a, b = pair
    send_frame(a, bytearray(b"abc"))
    send_frame(a, memoryview(b"defg"))
    assert recv_frame(b, 16) == b"abc"
    assert recv_frame(b, 16) == b"defg"


def test_frames_keep_their_boundaries(pair):
    a, b = pair
    for p in (b"one", b"", b"three"):
        send_frame(a, p)
    assert [recv_frame(b, 10) for _ in range(3)] == [b"one", b"", b"three"]


def test_frame_at_the_limit_is_accepted(pair):
    a, b = pair
    send_frame(a, b"x" * 1000)
    assert recv_frame(b, max_bytes=1000) == b"x" * 1000


def test_frame_above_the_limit_is_rejected(pair):
    a, b = pair
    send_frame(a, b"x" * 1001)
    with pytest.raises(ProtocolError, match="announced a frame of 1001 bytes, above the limit of 1000"):
        recv_frame(b, max_bytes=1000)


def test_huge_length_field_is_rejected_without_allocating(pair):
    a, b = pair
    a.sendall(struct.pack("!Q", 2**31))  # and nothing else: reading the body would block until the timeout
    b.settimeout(HANG)
    tracemalloc.start()
    try:
        start = time.monotonic()
        with pytest.raises(ProtocolError) as info:
            recv_frame(b, max_bytes=1 << 20, what="rank 3")
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < HANG / 2  # did not wait for the 2 GiB body
    assert peak < 1 << 20  # did not allocate the announced size
    message = str(info.value)
    assert "rank 3 announced a frame of 2147483648 bytes" in message
    assert "above the limit of 1048576 (HORA_MAX_FRAME_BYTES)" in message


def test_peer_closing_mid_frame(pair):
    a, b = pair
    a.sendall(struct.pack("!Q", 100) + b"x" * 10)
    a.close()
    with pytest.raises(PeerLostError, match=r"peer closed the connection \(10 of 100 bytes received\)"):
        recv_frame(b, max_bytes=1000)


def test_peer_closing_mid_header(pair):
    a, b = pair
    a.sendall(b"\x00\x00\x00")
    a.close()
    with pytest.raises(PeerLostError, match=r"rank 1 closed the connection \(3 of 8 bytes received\)"):
        recv_frame(b, max_bytes=1000, what="rank 1")


def test_peer_closed_before_frame(pair):
    a, b = pair
    a.close()
    with pytest.raises(PeerLostError, match=r"closed the connection \(0 of 8 bytes received\)"):
        recv_frame(b, max_bytes=1000)
