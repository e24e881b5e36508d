"""Listeners' shared guards: concurrent handshakes, a bound on pending ones, rate-limited reports of drops."""

from __future__ import annotations

import logging
import socket
import time

from hora._runtime.auth import Role, new_secret
from hora._runtime.connections import PeerListener, connect_peers
from hora._runtime.gate import PendingHandshakes, RejectLog


def test_a_flood_of_drops_is_one_warning_line(caplog):
    rejects = RejectLog(logging.getLogger("hora.test.gate"), "test listener", interval=3600)
    with caplog.at_level(logging.DEBUG, logger="hora.test.gate"):
        for i in range(100):
            rejects.drop(f"garbage #{i}")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert rejects.count == 100
    assert len(warnings) == 1 and "garbage #0" in warnings[0].getMessage()
    assert "reported at most every 3600s" in warnings[0].getMessage()


def test_past_the_limit_the_oldest_pending_connection_is_cut_off():
    server = socket.create_server(("127.0.0.1", 0))
    pending = PendingHandshakes(limit=2)
    clients = [socket.create_connection(server.getsockname()) for _ in range(3)]
    accepted = [server.accept()[0] for _ in range(3)]
    try:
        assert all(pending.admit(c) for c in accepted)
        clients[0].settimeout(10)
        assert clients[0].recv(1) == b""  # the oldest was cut off
        pending.close()
        assert not pending.admit(accepted[0])
        for c in clients[1:]:
            c.settimeout(10)
            assert c.recv(1) == b""
    finally:
        for s in clients + accepted + [server]:
            s.close()


def test_silent_connections_do_not_delay_the_real_peers():
    secret = new_secret()
    listener = PeerListener("127.0.0.1", secret)
    silent = [socket.create_connection(listener.address) for _ in range(5)]
    try:
        listener.start_accepting({(Role.DATA, 1), (Role.CONTROL, 2)}, time.monotonic() + 60)
        # the real peers' deadline is shorter than one silent connection's handshake deadline (5 s) times five
        data = connect_peers([(0, *listener.address)], Role.DATA, 1, secret, time.monotonic() + 8)
        control = connect_peers([(0, *listener.address)], Role.CONTROL, 2, secret, time.monotonic() + 8)
        accepted = listener.wait()
        assert set(accepted) == {(Role.DATA, 1), (Role.CONTROL, 2)}
        for s in [*accepted.values(), *data.values(), *control.values()]:
            s.close()
        for s in silent:  # and the listener let go of them
            s.settimeout(10)
            assert s.recv(64 * 1024) is not None and s.recv(1) == b""
    finally:
        listener.close()
        for s in silent:
            s.close()
