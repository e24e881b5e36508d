"""The rendezvous store, served in-process on 127.0.0.1 with real sockets."""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from hora._runtime.auth import Role, client_handshake, new_secret
from hora._runtime.rendezvous import RendezvousClient, RendezvousServer
from hora._wire import recv_exact, recv_frame, send_frame
from hora.errors import AuthenticationError, HoraError, RendezvousError

SECRET = b"s" * 32
HANG = 5.0  # generous: only there so that a bug becomes a failure instead of a stuck test


@pytest.fixture
def server() -> Iterator[RendezvousServer]:
    srv = RendezvousServer(SECRET, "127.0.0.1", 0, max_frame_bytes=1 << 16, handshake_timeout=HANG)
    srv.start()
    try:
        yield srv
    finally:
        srv.shutdown()


@pytest.fixture
def connect(server: RendezvousServer) -> Iterator[Callable[..., RendezvousClient]]:
    clients: list[RendezvousClient] = []

    def make(prefix: str = "job/", rank: int = 0, secret: bytes = SECRET) -> RendezvousClient:
        host, port = server.address
        client = RendezvousClient(host, port, secret, rank, prefix, time.monotonic() + HANG)
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


def _eventually(predicate: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + HANG
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _raw_authenticated(server: RendezvousServer) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=HANG)
    client_handshake(sock, SECRET, Role.RENDEZVOUS, 0, timeout=HANG)
    return sock


def _assert_dropped(sock: socket.socket) -> None:
    """The server closed ``sock``: a read sees EOF (or a reset, when the server closed with unread bytes)."""
    sock.settimeout(HANG)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def test_address_is_bound(server):
    host, port = server.address
    assert host == "127.0.0.1" and port > 0


def test_address_before_start():
    with pytest.raises(HoraError, match="not started"):
        _ = RendezvousServer(SECRET).address


def test_set_get(connect, server):
    client = connect()
    assert client.get("missing") is None
    client.set("rank/0", '{"addr": "127.0.0.1"}')
    assert client.get("rank/0") == '{"addr": "127.0.0.1"}'
    client.set("rank/0", "again")
    assert client.get("rank/0") == "again"
    assert server.snapshot("job/") == {"job/rank/0": "again"}


def test_add_counts(connect):
    a, b = connect(rank=0), connect(rank=1)
    assert a.add("arrived") == 1
    assert b.add("arrived") == 2
    assert a.add("arrived", 5) == 7
    assert b.get("arrived") == "7"


def test_wait_returns_existing_values(connect):
    client = connect()
    client.set("a", "1")
    client.set("b", "2")
    assert client.wait(["a", "b"], timeout=HANG) == {"a": "1", "b": "2"}


def test_wait_is_released_by_another_clients_set(connect):
    waiter, setter = connect(rank=0), connect(rank=1)
    timer = threading.Timer(0.05, setter.set, args=("late", "here"))
    timer.start()
    try:
        assert waiter.wait(["late"], timeout=HANG) == {"late": "here"}
    finally:
        timer.join(HANG)


def test_wait_at_least(connect):
    waiter, adder = connect(rank=0), connect(rank=1)
    adder.add("ready")
    timer = threading.Timer(0.05, adder.add, args=("ready",))
    timer.start()
    try:
        assert waiter.wait(["ready"], timeout=HANG, at_least=2) == {"ready": "2"}
    finally:
        timer.join(HANG)


def test_wait_timeout_reports_missing_keys(connect):
    client = connect()
    client.set("rank/0", "x")
    client.set("rank/2", "x")
    with pytest.raises(RendezvousError, match=r"timed out waiting for \['rank/1', 'rank/3'\]") as info:
        client.wait(["rank/0", "rank/1", "rank/2", "rank/3"], timeout=0.1)
    assert info.value.missing == ["rank/1", "rank/3"]  # type: ignore[attr-defined]
    client.set("rank/1", "x")  # the connection is still usable after a timed-out wait
    assert client.get("rank/1") == "x"


def test_wait_at_least_timeout_reports_counters_below(connect):
    client = connect()
    client.add("c1", 3)
    client.add("c2", 1)
    with pytest.raises(RendezvousError) as info:
        client.wait(["c1", "c2", "c3"], timeout=0.1, at_least=2)
    assert info.value.missing == ["c2", "c3"]  # type: ignore[attr-defined]


def test_prefixes_keep_jobs_apart(connect, server):
    job1, job2 = connect("job1/"), connect("job2/")
    job1.set("addr", "one")
    assert job2.get("addr") is None
    job2.set("addr", "two")
    assert job1.get("addr") == "one"
    assert job2.get("addr") == "two"
    assert job1.add("n") == 1 and job2.add("n") == 1
    assert server.snapshot("job1/") == {"job1/addr": "one", "job1/n": "1"}
    job1.set("only-in-job1", "x")
    with pytest.raises(RendezvousError) as info:
        job2.wait(["only-in-job1"], timeout=0.05)
    assert info.value.missing == ["only-in-job1"]  # type: ignore[attr-defined]


def test_wrong_secret_is_rejected_and_server_keeps_serving(connect, server):
    good = connect(rank=0)
    good.set("k", "v")
    with pytest.raises(AuthenticationError, match="rejected this process's credentials"):
        connect(rank=1, secret=b"w" * 32)
    assert _eventually(lambda: server.rejected == 1)
    assert good.get("k") == "v"  # the existing client is unaffected
    assert connect(rank=2).get("k") == "v"  # and new clients still get in
    assert server.rejected == 1


def test_wrong_role_is_rejected(server):
    with socket.create_connection(server.address, timeout=HANG) as sock, pytest.raises(AuthenticationError):
        client_handshake(sock, SECRET, Role.CONTROL, 0, timeout=HANG)
    assert _eventually(lambda: server.rejected == 1)


def test_unauthenticated_garbage_is_dropped(connect, server):
    with socket.create_connection(server.address, timeout=HANG) as sock:
        assert recv_exact(sock, 37)[:4] == b"HORA"  # the server's greeting
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n" + b"\0" * 64)
        _assert_dropped(sock)
    assert _eventually(lambda: server.rejected == 1)
    assert connect().add("still-alive") == 1


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",  # its first 8 bytes read as an absurd length
        struct.pack("!Q", 2**31),  # a 2 GiB frame announced after authenticating
        struct.pack("!Q", 2**64 - 1) + b"x" * 16,
    ],
    ids=["http", "2GiB-header", "max-header"],
)
def test_oversized_or_garbage_frame_after_handshake_drops_connection(connect, server, garbage):
    sock = _raw_authenticated(server)
    try:
        sock.sendall(garbage)
        _assert_dropped(sock)
    finally:
        sock.close()
    client = connect()
    client.set("k", "v")
    assert client.get("k") == "v"


def test_oversized_frame_after_handshake_counts_as_rejected(server):
    sock = _raw_authenticated(server)
    try:
        sock.sendall(struct.pack("!Q", 2**31))
        _assert_dropped(sock)  # the counter is incremented before the server closes the connection
    finally:
        sock.close()
    assert server.rejected == 1


@pytest.mark.parametrize(
    "frame",
    [
        b"\xff\xfenot json",
        b"[1, 2, 3]",
        b'{"op": "explode"}',
        b'{"op": "set"}',
        b'{"op": "add", "key": "k", "amount": "x"}',
    ],
    ids=["binary", "not-object", "unknown-op", "missing-field", "bad-amount"],
)
def test_malformed_request_after_handshake_drops_connection(connect, server, frame):
    sock = _raw_authenticated(server)
    try:
        send_frame(sock, frame)
        _assert_dropped(sock)
    finally:
        sock.close()
    assert _eventually(lambda: server.rejected == 1)
    assert connect().add("alive") == 1


def test_raw_authenticated_client_can_speak_the_protocol(server):
    sock = _raw_authenticated(server)
    try:
        send_frame(sock, b'{"op": "set", "key": "raw", "value": "1"}')
        assert recv_frame(sock, 1 << 16) == b'{"ok": true}'
    finally:
        sock.close()
    assert server.snapshot() == {"raw": "1"}


def test_shutdown_releases_a_blocked_wait(server, connect):
    client = connect()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait(["never"], timeout=60)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    time.sleep(0.05)
    server.shutdown()
    t.join(HANG)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RendezvousError)


def test_shutdown_then_connect_fails(server):
    host, port = server.address
    server.shutdown()
    with pytest.raises(RendezvousError, match="could not reach the rendezvous store"):
        RendezvousClient(host, port, SECRET, 0, "job/", time.monotonic() + 0.2)


SERVER_UNDER_A_LOW_FD_LIMIT = """
import resource, sys, time
from hora._runtime.rendezvous import RendezvousServer
server = RendezvousServer(bytes.fromhex(sys.argv[1]))
print(server.start()[1], flush=True)
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
sys.stdin.read()  # until the test is done
"""


@contextlib.contextmanager
def _store_under_a_low_fd_limit(secret: bytes, flood_size: int) -> Iterator[tuple[subprocess.Popen[str], int, list]]:
    """A store in a process of its own with 32 descriptors, and ``flood_size`` idle connections to it (closed at
    the end, with the process): yields (process, port, flood)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER_UNDER_A_LOW_FD_LIMIT, secret.hex()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flood: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(flood_size)]
        yield proc, port, flood
    finally:
        for s in flood:
            s.close()
        proc.stdin.close()
        proc.wait(30)


def test_the_store_survives_running_out_of_file_descriptors():
    """Issue 19, item 8: one EMFILE from accept() used to stop the store for good."""
    secret = new_secret()
    with _store_under_a_low_fd_limit(secret, 60) as (proc, port, flood):  # past the server's 32 fds
        for s in flood:
            s.settimeout(0.05)
            try:
                s.recv(64)  # the greeting of those it could accept
            except TimeoutError:
                pass
        for s in flood:
            s.close()
        client = RendezvousClient("127.0.0.1", port, secret, 0, "t/", time.monotonic() + 30)
        client.set("k", "v")
        assert client.get("k") == "v"
        client.close()
    err = proc.stderr.read()
    assert "cannot accept connections: Too many open files" in err, err
    assert err.count("Too many open files") == 1, "the report must be rate-limited"


def test_a_real_client_gets_in_while_idle_connections_hold_every_descriptor():
    """Issue 27, item 12: under ``ulimit -n`` lower than the pending-handshake bound, a flood of idle connections
    kept every descriptor and a real rank's connection waited until their handshake deadlines."""
    secret = new_secret()
    with _store_under_a_low_fd_limit(secret, 40) as (_, port, _flood):  # held open, saying nothing
        time.sleep(0.5)  # the server accepts what its descriptors allow
        client = RendezvousClient("127.0.0.1", port, secret, 0, "t/", time.monotonic() + 3)
        client.set("k", "v")
        assert client.get("k") == "v"
        client.close()
