"""HORA_OP_TIMEOUT_SECONDS bounds the time without progress on a TCP link, not the whole transfer (issue 19,
item 10): two TCP transports over real sockets through a proxy that passes bytes at a slow but steady rate."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from hora._dtypes import ReduceOp
from hora._transport.tcp import TcpTransport
from hora.errors import TimeoutError as HoraTimeout

RATE = 4 << 20  # bytes per second and direction: an 8 MiB allreduce moves 8 MiB each way (about 2 s)


def _pipe(src: socket.socket, dst: socket.socket, rate: float, stop: threading.Event) -> None:
    start, moved = time.monotonic(), 0
    src.settimeout(0.1)
    while not stop.is_set():
        try:
            data = src.recv(32 << 10)
        except TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return
        moved += len(data)
        ahead = moved / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
        try:
            dst.sendall(data)
        except OSError:
            return


def _small_buffers(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    return s


@pytest.fixture
def slow_link():
    """(rank 0's socket, rank 1's socket), joined through a throttling proxy."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    a = _small_buffers(socket.socket())
    a.connect(server.getsockname())
    a_peer = _small_buffers(server.accept()[0])
    b = _small_buffers(socket.socket())
    b.connect(server.getsockname())
    b_peer = _small_buffers(server.accept()[0])
    threads = [threading.Thread(target=_pipe, args=(x, y, RATE, stop), daemon=True)
               for x, y in ((a_peer, b_peer), (b_peer, a_peer))]
    for t in threads:
        t.start()
    yield a, b
    stop.set()
    for s in (a, b, a_peer, b_peer, server):
        s.close()
    for t in threads:
        t.join(5)


def test_a_slow_healthy_link_is_not_a_time_out(slow_link):
    a, b = slow_link
    transports = [TcpTransport(0, 2, {1: a}, 1 << 20, 0.5), TcpTransport(1, 2, {0: b}, 1 << 20, 0.5)]
    data = [np.full(2 << 20, r + 1, np.float32) for r in range(2)]  # 8 MiB each
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            transports[r].allreduce(data[r], data[r], ReduceOp.SUM)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for t in transports:
        t._sender.close()
    assert errors == []
    assert all(float(d[0]) == 3.0 and float(d[-1]) == 3.0 for d in data)


def test_no_bytes_at_all_is_a_time_out_that_says_so(slow_link):
    a, _ = slow_link  # rank 1 never takes part
    transport = TcpTransport(0, 2, {1: a}, 1 << 20, 0.5)
    try:
        with pytest.raises(HoraTimeout, match=r"no bytes (from|went to) rank 1 for 0.5s over TCP \(link down or peer stuck"):
            transport.allreduce(np.ones(2 << 20, np.float32), np.ones(2 << 20, np.float32), ReduceOp.SUM)
    finally:
        transport._sender.close()
