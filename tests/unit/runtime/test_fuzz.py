"""Fuzzing what an unauthenticated or hostile peer controls: the frame decoder, the handshake, and every live
listener (the rendezvous store and a rank's peer listener here; a job host's agent in
tests/multiprocess/jobs/test_hosts.py). Random bytes, truncated frames and huge lengths end in hora's own
errors, never another exception, a hang or a huge allocation; the listeners keep serving the real clients."""

from __future__ import annotations

import json
import random
import socket
import struct
import time

import pytest

from hora._runtime.auth import Role, client_handshake, new_secret, server_handshake
from hora._runtime.connections import PeerListener, connect_peers
from hora._runtime.rendezvous import RendezvousClient, RendezvousServer
from hora._wire import recv_frame
from hora.errors import AuthenticationError, PeerLostError, ProtocolError
from support.fuzz import LIMIT, frame_case, handshake_case


class _Bytes:
    """A socket stand-in that hands out a fixed byte string in random-sized pieces, then end of stream."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.data, self.pos, self.rng = data, 0, rng

    def recv_into(self, view: memoryview, n: int) -> int:
        k = min(n, len(self.data) - self.pos, self.rng.randint(1, 64))
        view[:k] = self.data[self.pos : self.pos + k]
        self.pos += k
        return k


def test_the_frame_decoder_on_100000_random_inputs():
    rng = random.Random(19)
    outcomes = {"frame": 0, "lost": 0, "too big": 0}
    for _ in range(100_000):
        data = frame_case(rng)
        try:
            frame = recv_frame(_Bytes(data, rng), LIMIT, "fuzz")  # type: ignore[arg-type]
        except PeerLostError:
            outcomes["lost"] += 1
        except ProtocolError:
            outcomes["too big"] += 1
            (length,) = struct.unpack("!Q", data[:8])
            assert length > LIMIT
        else:
            outcomes["frame"] += 1
            (length,) = struct.unpack("!Q", data[:8])
            assert frame == data[8 : 8 + length] and len(frame) == length
    assert all(outcomes.values()), outcomes


def test_the_server_handshake_on_random_clients():
    rng = random.Random(1919)
    secret = new_secret()
    for _ in range(20_000):
        server, client = socket.socketpair()
        try:
            client.sendall(handshake_case(rng, secret))
            client.shutdown(socket.SHUT_WR)
            with pytest.raises((AuthenticationError, ProtocolError)):
                server_handshake(server, secret, timeout=5.0)
        finally:
            server.close()
            client.close()


def _attack(addr: tuple[str, int], secret: bytes, role: Role, rng: random.Random) -> None:
    """One hostile connection: garbage, a truncated or forged handshake, or (authenticated, for the store) a bad frame."""
    kind = rng.randrange(3 if role is Role.RENDEZVOUS else 2)
    case = rng.randbytes(rng.randrange(0, 200)) if kind == 0 else handshake_case(rng, secret) if kind == 1 else (
        frame_case(rng))
    with socket.create_connection(addr, timeout=10) as s:
        try:
            if kind == 1:
                s.recv(37)
            elif kind == 2:
                client_handshake(s, secret, role, 0, timeout=10)
            s.sendall(case)
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):  # until the server drops the connection
                pass
        except OSError:  # it dropped the connection before we were done: as it should
            pass


def test_the_rendezvous_store_under_fuzz_keeps_serving():
    secret = new_secret()
    server = RendezvousServer(secret, max_frame_bytes=LIMIT)
    addr = server.start()
    rng = random.Random(7)
    try:
        for _ in range(300):
            _attack(addr, secret, Role.RENDEZVOUS, rng)
        client = RendezvousClient(*addr, secret, 0, "fuzz/", time.monotonic() + 30)
        client.set("k", json.dumps([1, 2]))
        assert client.get("k") == "[1, 2]"
        client.close()
        assert server.rejected >= 200
    finally:
        server.shutdown()


def test_a_peer_listener_under_fuzz_still_takes_its_real_peers():
    secret = new_secret()
    listener = PeerListener("127.0.0.1", secret)
    rng = random.Random(8)
    try:
        listener.start_accepting({(Role.DATA, 1), (Role.CONTROL, 2)}, time.monotonic() + 60)
        for _ in range(300):
            _attack(listener.address, secret, Role.DATA, rng)
        data = connect_peers([(0, *listener.address)], Role.DATA, 1, secret, time.monotonic() + 30)
        control = connect_peers([(0, *listener.address)], Role.CONTROL, 2, secret, time.monotonic() + 30)
        accepted = listener.wait()
        assert set(accepted) == {(Role.DATA, 1), (Role.CONTROL, 2)}
        assert listener.rejected >= 200
        for s in [*accepted.values(), *data.values(), *control.values()]:
            s.close()
    finally:
        listener.close()
