"""The servers' ports under attack and a server killed mid-training: wrong secrets and garbage are dropped before
anything is parsed and the server keeps serving; a killed server makes every worker raise naming it and its shards,
and nothing hangs."""

from __future__ import annotations

import socket
import struct
import threading

import numpy as np
import pytest

from hora._runtime.auth import Role, client_handshake
from hora.errors import AuthenticationError, PeerLostError
from hora.ps import FixedShardsPartitioner
from hora.ps.client import Client
from hora.ps.messages import Op
from hora.ps.protocol import pack_request
from support.ps_cluster import LIMIT, PsCluster


def test_wrong_secret_garbage_and_oversized_frames_are_dropped_and_the_server_keeps_serving():
    cluster = PsCluster(1, workers=2)
    try:
        host, port = cluster.addresses[0]
        with pytest.raises(AuthenticationError):
            Client([(host, port)], b"w" * 32, 0, timeout=LIMIT)
        for garbage in (b"GET / HTTP/1.1\r\n\r\n" * 20, b"\x00" * 4096, struct.pack("!Q", 1 << 62) + b"x" * 100):
            with socket.create_connection((host, port), timeout=LIMIT) as s:
                s.recv(64)  # the greeting
                s.sendall(garbage)
                s.settimeout(LIMIT)
                assert s.recv(1) in (b"", b"\x00")  # refused, never answered
        # an authenticated worker announcing a huge header or payload is cut off before anything is allocated
        hot = (pack_request(Op.PUSH, b"w", 0, nbytes=1 << 40), b"\xb1\x63" + bytes(30))  # huge payload, unknown op
        for frame in (struct.pack("!Q", 1 << 40), struct.pack("!Q", 20) + b'{"op":"push","nbytes"', *hot):
            s = socket.create_connection((host, port), timeout=LIMIT)
            try:
                client_handshake(s, cluster.secret, Role.PS, 0, timeout=LIMIT)
                s.sendall(frame)
                s.settimeout(LIMIT)
                assert s.recv(1) == b""
            finally:
                s.close()
        # a worker number outside the job is refused too
        s = socket.create_connection((host, port), timeout=LIMIT)
        try:
            client_handshake(s, cluster.secret, Role.PS, 7, timeout=LIMIT)
            s.settimeout(LIMIT)
            assert s.recv(1) == b""
        finally:
            s.close()
        with cluster.client(0) as c:
            c.register("after.attack", np.ones(3, np.float32), rule="sum")
            np.testing.assert_array_equal(c.push_pull("after.attack", np.ones(3, np.float32)), [2, 2, 2])
            assert c.stats()[0]["rejected_connections"] >= 8
    finally:
        errs = cluster.close()
    assert cluster.procs[0].returncode == 0, errs


def test_a_killed_server_makes_every_worker_raise_naming_it_and_its_shards():
    cluster = PsCluster(2, workers=2)
    clients = [cluster.client(r, partitioner=FixedShardsPartitioner(2), consistency="bounded(1)") for r in range(2)]
    errors: dict[int, BaseException] = {}
    try:
        for c in clients:
            c.register({"emb": np.zeros((100, 4), np.float32), "bias": np.zeros(4, np.float32)}, rule="sgd")
        doomed = clients[0].placement("emb")[1][2]
        started = threading.Barrier(3, timeout=LIMIT)

        def train(r):
            started.wait()
            try:
                while True:
                    clients[r].push_pull("emb", np.ones((100, 4), np.float32))
                    clients[r].push_pull("bias", np.ones(4, np.float32))
            except BaseException as exc:
                errors[r] = exc

        threads = [threading.Thread(target=train, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        started.wait()
        cluster.kill(doomed)
        for t in threads:
            t.join(LIMIT)
        assert not any(t.is_alive() for t in threads), "a worker hung after the server died"
    finally:
        for c in clients:
            c.close()
        cluster.close()
    assert sorted(errors) == [0, 1]
    for exc in errors.values():
        assert isinstance(exc, PeerLostError), repr(exc)
        assert f"parameter server {doomed}" in str(exc) and "'emb' shard 1" in str(exc)
