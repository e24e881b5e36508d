"""Rank functions for the failure tests: mismatches, killed peers, no-shows, attacks on listening ports."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np

import hora.numpy as hvd
from hora._runtime.auth import Role, client_handshake, new_secret
from hora.errors import AuthenticationError, MismatchError, PeerLostError


def mismatch_worker(kind: str) -> tuple[str, str, float]:
    hvd.init()
    r = hvd.rank()
    hvd.barrier()
    start = time.monotonic()
    try:
        if kind == "shape":
            hvd.allreduce(np.zeros((4, 3 if r == 0 else 2), np.float32), name="grad.fc1")
        elif kind == "dtype":
            hvd.allreduce(np.zeros(4, np.float32 if r % 2 == 0 else np.float64), name="w")
        elif kind == "op":
            hvd.allreduce(np.zeros(4), op=hvd.Sum if r == 0 else hvd.Max, name="w")
        elif kind == "root":
            hvd.broadcast(np.zeros(4), root_rank=min(r, 1), name="b")
        elif kind == "scale":
            hvd.allreduce(np.zeros(4), prescale_factor=1.0 + (r == 1), name="s")
        elif kind == "trailing":
            hvd.allgather(np.zeros((2, 1 + (r == 1))), name="ag")
        elif kind == "kind":
            (hvd.allreduce if r == 0 else hvd.allgather)(np.zeros(3), name="k")
        elif kind == "ndim":
            hvd.alltoall(np.zeros((3, 2) if r == 0 else (3,)), name="a2a")
        else:
            raise AssertionError(kind)
    except MismatchError as exc:
        elapsed = time.monotonic() - start
        message, name = str(exc), type(exc).__name__
    else:
        raise AssertionError(f"rank {r}: no MismatchError for a {kind} mismatch")
    # the engine keeps working after a mismatch
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after")[0] == hvd.size()
    hvd.shutdown()
    return name, message, elapsed


def duplicate_name_worker() -> str:
    """Rank 0 submits 'dup' twice; rank 1 submits it only after the barrier, so the first cannot have completed."""
    hvd.init()
    message = ""
    if hvd.rank() == 0:
        h = hvd.allreduce_async(np.ones(3), name="dup")
        try:
            hvd.allreduce_async(np.ones(3), name="dup")
        except MismatchError as exc:
            message = str(exc)
        else:
            raise AssertionError("a duplicate name in flight was accepted")
        hvd.barrier()
        hvd.synchronize(h)
    else:
        hvd.barrier()
        hvd.allreduce(np.ones(3), name="dup")
    hvd.shutdown()
    return message


def killed_peer_worker(tmpdir: str, victim: int, transport: str) -> None:
    """The victim SIGKILLs itself during a large allreduce; survivors must raise PeerLostError within seconds."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # survive hora run's clean-up long enough to report
    hvd.init(transport=transport)
    r = hvd.rank()
    x = np.ones(8_000_000, np.float32)  # 32 MB: many chunks, so the kill lands inside a collective
    hvd.allreduce(x, name="warmup")
    if r == victim:
        def die() -> None:
            with open(os.path.join(tmpdir, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(0.3, die).start()
    try:
        for i in range(100_000):
            hvd.allreduce(x, name=f"big{i}")
    except PeerLostError as exc:
        detected = time.time()
        with open(os.path.join(tmpdir, f"survivor.{r}"), "w") as f:
            f.write(f"{detected!r}\n{exc}")
        os._exit(3)
    raise AssertionError("the loop ended without losing the peer")


def raising_worker(code: int) -> None:
    hvd.init()
    if hvd.rank() == 1:
        time.sleep(0.2)
        if code:
            raise SystemExit(code)
        raise ValueError("boom from rank 1")
    hvd.allreduce(np.ones(4), name="never-completes")


def asleep_worker() -> None:
    """Rank 2 never submits the collective the others wait in (it sleeps); the stall shutdown ends the job."""
    hvd.init()
    if hvd.rank() == 2:
        time.sleep(120)
    hvd.allreduce(np.ones(4), name="waits.for.rank2")


def late_worker() -> None:
    if int(os.environ["HORA_RANK"]) == 1:
        time.sleep(600)  # never arrives
    hvd.init()


def attack_worker() -> bool:
    """Rank 0 attacks the launcher's rendezvous port before joining the job; the job must still work."""
    if int(os.environ["HORA_RANK"]) == 0:
        addr, port = os.environ["HORA_RENDEZVOUS_ADDR"], int(os.environ["HORA_RENDEZVOUS_PORT"])
        attack_port(addr, port, bytes.fromhex(os.environ["HORA_SECRET"]))
    hvd.init()
    assert hvd.allreduce(np.ones(2), op=hvd.Sum)[0] == hvd.size()
    hvd.shutdown()
    return True


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(20)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def attack_port(addr: str, port: int, secret: bytes) -> None:
    # 1. garbage instead of a handshake
    with socket.create_connection((addr, port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(200))
        assert _closed_by_server(s)
    # 2. a wrong secret
    with socket.create_connection((addr, port)) as s:
        try:
            client_handshake(s, new_secret(), Role.RENDEZVOUS, 0, timeout=10)
        except AuthenticationError:
            pass
        else:
            raise AssertionError("the server accepted a wrong secret")
    # 3. an unauthenticated frame announcing 2**31 bytes: the handshake fields are fixed-size, so it is garbage
    with socket.create_connection((addr, port)) as s:
        s.recv(37)
        s.sendall((2**31).to_bytes(8, "big") + b"\0" * 100)
        assert _closed_by_server(s)
    # 4. an authenticated client announcing a 2**31-byte frame: rejected before allocating
    with socket.create_connection((addr, port)) as s:
        client_handshake(s, secret, Role.RENDEZVOUS, 0, timeout=10)
        s.sendall((2**31).to_bytes(8, "big"))
        assert _closed_by_server(s)


def hang_worker() -> None:
    """Rank 0 waits for a collective rank 1 never submits: a hang, for the time-limit test."""
    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(1), name="only-rank-0")
    else:
        time.sleep(600)


def silent_connections_worker(count: int) -> tuple[bool, int]:
    """Every rank is met by ``count`` connections that never say a word: at the launcher's rendezvous store before
    init, and at its own peer listener the moment it starts accepting (before any real peer can reach it, as a
    local process watching /proc/net/tcp would). The job must start and run anyway."""
    from hora._runtime import connections

    silent: list[socket.socket] = []
    addr, port = os.environ["HORA_RENDEZVOUS_ADDR"], int(os.environ["HORA_RENDEZVOUS_PORT"])
    silent += [socket.create_connection((addr, port)) for _ in range(count)]
    original = connections.PeerListener.start_accepting

    def start_accepting(self, expected, deadline):  # type: ignore[no-untyped-def]
        silent.extend(socket.create_connection(self.address) for _ in range(count))
        original(self, expected, deadline)

    connections.PeerListener.start_accepting = start_accepting  # type: ignore[method-assign]
    try:
        hvd.init()
        ok = hvd.allreduce(np.ones(2), op=hvd.Sum)[0] == hvd.size()
        hvd.shutdown()
    finally:
        connections.PeerListener.start_accepting = original  # type: ignore[method-assign]
        for s in silent:
            s.close()
    return bool(ok), len(silent)


def marker_then_sleep_worker(directory: str) -> None:
    """Each rank says it started (a file per rank), then sleeps until the launcher stops it."""
    hvd.init()
    with open(os.path.join(directory, f"started.{hvd.rank()}"), "w"):
        pass
    time.sleep(600)
