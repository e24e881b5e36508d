"""Clients in this process against real server processes (``python -m hora.ps``) over authenticated TCP: dense and
sparse updates against a one-process reference, sync mode bitwise, the staleness bound, registration mismatches,
checkpoints restored onto another number of servers."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hora.errors import ConfigError, MismatchError
from hora.ps import FixedShardsPartitioner
from hora.ps.rules import apply_dense, apply_rows, new_slots, parse_rule
from support.ps_cluster import LIMIT, PsCluster


@pytest.fixture(scope="module")
def two_servers():
    cluster = PsCluster(2, workers=3)
    yield cluster
    errs = cluster.close()
    assert all(p.returncode == 0 for p in cluster.procs), errs


def _threads(targets):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LIMIT)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_dense_rules_over_two_servers_match_a_one_process_reference(two_servers, shm):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((101, 7)).astype(np.float32)
    b0 = rng.standard_normal(5).astype(np.float64)
    rule = parse_rule({"rule": "adam", "lr": 0.01})
    part = FixedShardsPartitioner(4)
    with two_servers.client(0, partitioner=part, shm=shm) as c:
        c.register({f"dense.w.{shm}": w0, f"dense.b.{shm}": b0}, rule=rule)
        assert sorted({s for _, _, s in c.placement(f"dense.w.{shm}")}) == [0, 1]  # sharded across both servers
        ref_w, ref_b = w0.copy(), b0.copy()
        slots_w, slots_b = new_slots(rule, w0.shape, w0.dtype), new_slots(rule, b0.shape, b0.dtype)
        for t in range(1, 4):
            gw, gb = rng.standard_normal(w0.shape).astype(np.float32), rng.standard_normal(5)
            got = c.push_pull(f"dense.w.{shm}", gw)
            c.push(f"dense.b.{shm}", gb)
            # the reference applies the rule shard by shard, as the servers do (Adam's step counts per shard)
            for lo, hi, _ in c.placement(f"dense.w.{shm}"):
                s = {k: v[lo:hi] for k, v in slots_w.items()}
                apply_dense(rule, ref_w[lo:hi], gw[lo:hi], s, t)
            apply_dense(rule, ref_b, gb, slots_b, t)
            np.testing.assert_array_equal(got, ref_w)
        out = np.empty_like(b0)
        assert c.pull(f"dense.b.{shm}", out=out) is out
        np.testing.assert_array_equal(out, ref_b)
        again = c.pull(f"dense.w.{shm}")
        again += 1  # the result is the caller's own array
        np.testing.assert_array_equal(c.pull(f"dense.w.{shm}"), ref_w)
        with pytest.raises(ConfigError, match="shape"):
            c.push(f"dense.w.{shm}", np.zeros((3, 3), np.float32))
        with pytest.raises(ConfigError, match="no such variable"):
            c.pull("nope")


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_sparse_rows_sum_duplicates_and_send_only_the_rows(two_servers, shm):
    rows, dim = 10_000, 16
    table = np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)
    rule = parse_rule({"rule": "adagrad", "lr": 0.5, "initial_accumulator": 0.1})
    with two_servers.client(0, partitioner=FixedShardsPartitioner(2), shm=shm) as c:
        emb = f"emb.{shm}"
        c.register(emb, table, rule=rule)
        ids = np.array([5, 9_999, 5, 42, 5_000, 42, 42])
        np.testing.assert_array_equal(c.pull_rows(emb, ids), table[ids])
        before = sum(s["bytes_in"] for s in c.stats())
        grads = np.ones((len(ids), dim), np.float32) * np.arange(1, len(ids) + 1, dtype=np.float32)[:, None]
        c.push_rows(emb, ids, grads)
        sent = sum(s["bytes_in"] for s in c.stats()) - before
        assert sent == 4 * (8 + dim * 4)  # four distinct rows, each once: ids + values, nothing else
        ref = table.copy()
        uniq, inv = np.unique(ids, return_inverse=True)
        summed = np.zeros((len(uniq), dim), np.float32)
        np.add.at(summed, inv, grads)
        apply_rows(rule, ref, uniq, summed, new_slots(rule, ref.shape, ref.dtype), 1)
        np.testing.assert_array_equal(c.pull(emb), ref)
        assert not np.array_equal(ref[uniq], table[uniq])
        with pytest.raises(ConfigError, match="ids must lie in"):
            c.pull_rows(emb, [rows])


@pytest.mark.parametrize("mode", ["async", "bounded(1)", "sync"])
@pytest.mark.parametrize("single_copy", [True, False], ids=["single-copy", "segment"])
def test_large_dense_requests_single_copy_or_through_the_segment_match_a_reference(two_servers, mode, single_copy):
    """Shards larger than the single-copy threshold (and than a chunk of the streamed update, for w): the server
    reads the gradients from and writes the values into the workers' arrays itself, or everything goes through the
    segment; either way bitwise the one-process reference (async: fused per chunk; bounded: update, then wait and
    write; sync: the whole gradient read first)."""
    workers, steps = two_servers.workers, 3
    rng = np.random.default_rng(11)
    init = {"w": rng.standard_normal((700, 400)).astype(np.float32), "b": rng.standard_normal((300, 500))}
    rules = {"w": parse_rule({"rule": "adam", "lr": 0.01}), "b": parse_rule({"rule": "momentum", "lr": 0.1})}
    names = {n: f"large.{n}.{mode}.{single_copy}" for n in init}
    clients = [two_servers.client(r, partitioner=FixedShardsPartitioner(2), consistency=mode, shm=True,
                                  single_copy=single_copy) for r in range(workers)]  # fmt: skip
    ref = {n: v.copy() for n, v in init.items()}
    slots = {n: new_slots(rules[n], v.shape, v.dtype) for n, v in init.items()}
    try:
        for c in clients:
            for n, v in init.items():
                c.register(names[n], v, rule=rules[n])
        parts = {n: clients[0].placement(names[n]) for n in init}
        for step in range(steps):
            grads = {(n, r): rng.standard_normal(v.shape).astype(v.dtype) for n, v in init.items() for r in range(workers)}
            got = {}
            if mode == "sync":  # every worker pushes, then pulls: the server applies the step's mean once
                for r, c in enumerate(clients):
                    for n in init:
                        c.push(names[n], grads[(n, r)])
                for r, c in enumerate(clients):
                    got.update({(n, r): c.pull(names[n]) for n in init})
            else:  # one worker after the other: each push is applied when it arrives
                for r, c in enumerate(clients):
                    for n in init:
                        g = grads[(n, r)].copy()
                        got[(n, r)] = c.push_pull(names[n], g, out=g)  # the result may overwrite the gradient
            for n in init:
                if mode == "sync":  # the step's gradients summed in rank order, divided by N, applied once
                    mean = grads[(n, 0)].copy()
                    for r in range(1, workers):
                        mean += grads[(n, r)]
                    updates = [(step + 1, np.divide(mean, workers, out=mean))]
                else:
                    updates = [(step * workers + r + 1, grads[(n, r)]) for r in range(workers)]
                for r, (t, g) in enumerate(updates):
                    for lo, hi, _ in parts[n]:
                        apply_dense(rules[n], ref[n][lo:hi], g[lo:hi], {k: v[lo:hi] for k, v in slots[n].items()}, t)
                    for who in range(workers) if mode == "sync" else [r]:
                        assert got[(n, who)].tobytes() == ref[n].tobytes(), (n, step, who)
        for c in clients:
            assert c.shared_memory == [True, True]
            assert [c.links[s].segment.single_copy for s in range(2)] == [single_copy] * 2  # root may read any process
    finally:
        for c in clients:
            c.close()


def test_sync_mode_is_bitwise_a_sequential_reference(two_servers):
    workers, steps = two_servers.workers, 4
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((64, 33)).astype(np.float32)
    grads = rng.standard_normal((steps, workers, 64, 33)).astype(np.float32) * 1e3
    rule = parse_rule({"rule": "momentum", "lr": 0.01, "momentum": 0.9})
    clients = [two_servers.client(r, partitioner=FixedShardsPartitioner(2), consistency="sync") for r in range(workers)]
    results = {}
    try:
        for c in clients:
            c.register("sync.w", w0, rule=rule)

        def worker(r):
            def run():
                order = np.random.default_rng(r)
                for s in range(steps):
                    if order.random() < 0.5:
                        threading.Event().wait(0.01)  # arrive in a different order every step
                    results[(r, s)] = clients[r].push_pull("sync.w", grads[s, r])
            return run

        _threads([worker(r) for r in range(workers)])
    finally:
        for c in clients:
            c.close()
    ref = w0.copy()
    slots = new_slots(rule, ref.shape, ref.dtype)
    for s in range(steps):
        acc = grads[s, 0].copy()
        for r in range(1, workers):
            acc += grads[s, r]
        np.divide(acc, workers, out=acc)
        parts = [(0, 32), (32, 64)]
        for lo, hi in parts:
            apply_dense(rule, ref[lo:hi], acc[lo:hi], {k: v[lo:hi] for k, v in slots.items()}, s + 1)
        for r in range(workers):
            assert results[(r, s)].tobytes() == ref.tobytes(), (r, s)


def test_bounded_staleness_holds_with_one_slow_worker(two_servers):
    k, steps = 2, 12
    clients = [two_servers.client(r, consistency=f"bounded({k})") for r in range(3)]
    clocks = [0, 0, 0]
    worst = [0]
    lock = threading.Lock()
    try:
        for c in clients:
            c.register("bounded.w", np.zeros(8, np.float32), rule="sum")

        def worker(r):
            def run():
                for _ in range(steps):
                    clients[r].pull("bounded.w")
                    with lock:
                        worst[0] = max(worst[0], clocks[r] - min(clocks))
                    if r == 2:
                        threading.Event().wait(0.02)  # the slow one
                    with lock:  # counted before the push, so this view is never ahead of the servers'
                        clocks[r] += 1
                    clients[r].push("bounded.w", np.ones(8, np.float32))
            return run

        _threads([worker(r) for r in range(3)])
        seen = max(s["staleness"].get("bounded.w", 0) for s in clients[0].stats())
        np.testing.assert_array_equal(clients[0].pull("bounded.w"), np.full(8, 3 * steps, np.float32))
    finally:
        for c in clients:
            c.close()
    assert worst[0] <= k and 0 < seen <= k


def test_async_mode_lets_the_fast_worker_run_ahead(two_servers):
    clients = [two_servers.client(r, consistency="async") for r in range(2)]
    try:
        for c in clients:
            c.register("async.w", np.zeros(4, np.float32), rule="sum")
        clients[1].pull("async.w")
        for _ in range(10):
            clients[0].push_pull("async.w", np.ones(4, np.float32))  # never waits for worker 1
        assert max(s["staleness"].get("async.w", 0) for s in clients[0].stats()) >= 9
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_registration_mismatch_raises_on_every_worker(two_servers, shm):
    a, b = two_servers.client(0, shm=shm), two_servers.client(1, shm=shm)
    name = f"mm.{shm}"
    try:
        a.register(name, np.zeros((4, 2), np.float32), rule="sgd")
        with pytest.raises(MismatchError, match=rf"mm\.{shm}.*shape"):
            b.register(name, np.zeros((4, 3), np.float32), rule="sgd")
        with pytest.raises(MismatchError, match=rf"mm\.{shm}"):  # the first worker hears of it at its next request
            a.push(name, np.zeros((4, 2), np.float32))
        with pytest.raises(MismatchError):  # a refusal leaves the connection usable: the same answer again
            a.push_pull(name, np.zeros((4, 2), np.float32))
    finally:
        a.close()
        b.close()


def test_checkpoint_restores_onto_three_servers(tmp_path, two_servers):
    rng = np.random.default_rng(3)
    emb = rng.standard_normal((1001, 8)).astype(np.float32)
    rule = {"rule": "adam", "lr": 0.1}
    with two_servers.client(0, partitioner=FixedShardsPartitioner(2)) as c:
        c.register("ck.emb", emb, rule=rule)
        for _ in range(2):
            c.push("ck.emb", rng.standard_normal(emb.shape).astype(np.float32))
        c.save(str(tmp_path), step=2)
        saved = c.pull("ck.emb")
        grad = rng.standard_normal(emb.shape).astype(np.float32)
        c.push("ck.emb", grad)
        expected_next = c.pull("ck.emb")
    files = {p.name for p in tmp_path.iterdir()}  # the servers save every variable they hold (other tests' too)
    assert {"ck.emb.shard0.npz", "ck.emb.shard1.npz", "manifest.json"} <= files
    assert not [f for f in files if f.startswith(".tmp-")]
    three = PsCluster(3, workers=1)
    try:
        with three.client(0, partitioner=FixedShardsPartitioner(3)) as c:
            c.register("ck.emb", np.zeros_like(emb), rule=rule)
            assert len(c.placement("ck.emb")) == 3
            assert c.restore(str(tmp_path)) == 2
            np.testing.assert_array_equal(c.pull("ck.emb"), saved)
            c.push("ck.emb", grad)  # the optimizer slots and step came back too (re-sharded)
            np.testing.assert_array_equal(c.pull("ck.emb"), expected_next)
    finally:
        three.close()


def test_a_departed_worker_stops_nobody_under_bounded_and_fails_sync_clearly(two_servers):
    from hora.errors import PeerLostError

    clients = [two_servers.client(r) for r in range(3)]
    try:
        for c in clients:
            c.register("leave.bounded", np.zeros(4, np.float32), rule="sum", consistency="bounded(1)")
            c.register("leave.sync", np.zeros(4, np.float32), rule="sum", consistency="sync")
        clients[1].close()
        clients[2].close()
        for _ in range(5):  # would wait for ever on workers 1 and 2 if they still counted
            clients[0].push_pull("leave.bounded", np.ones(4, np.float32))
        with pytest.raises(PeerLostError, match=r"worker\(s\) \[1, 2\], which disconnected"):
            clients[0].push_pull("leave.sync", np.ones(4, np.float32))
    finally:
        clients[0].close()


def test_single_copy_is_granted_only_to_the_segments_owner_and_never_taken_unasked(two_servers, monkeypatch):
    """A worker that names another pid, or an address that does not hold its segment's token, gets no single-copy
    access (its requests go through the segment, correct); a single-copy request the server did not grant drops the
    connection, and the server serves on."""
    import dataclasses
    import os
    import subprocess
    import sys

    from hora.errors import PeerLostError
    from hora.ps import server_link
    from hora.ps.segment import _DIR, TOKEN_AT

    real = server_link.announce
    big = np.ones(1 << 17, np.float32)  # 512 KiB: above the single-copy threshold
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    mappers: list[subprocess.Popen[str]] = []

    def another_mapper(m):
        """Issue 27, item 8: another process of this user maps the worker's very segment, and the worker names it
        (and where the token is in it): the token matches there, but that process is not the connection's."""
        code = ("import ctypes, mmap, os, sys, time\n"
                "f = os.open(sys.argv[1], os.O_RDWR); mm = mmap.mmap(f, 0)\n"
                "print(ctypes.addressof(ctypes.c_char.from_buffer(mm)), flush=True); time.sleep(120)")
        mapper = subprocess.Popen([sys.executable, "-c", code, os.path.join(_DIR, m.name)],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        mappers.append(mapper)
        at = int(mapper.stdout.readline())  # type: ignore[union-attr]
        return dataclasses.replace(m, pid=mapper.pid, token_at=at + TOKEN_AT)

    try:
        forgeries = {
            "pid": lambda m: dataclasses.replace(m, pid=other.pid),
            "token": lambda m: dataclasses.replace(m, token_at=m.token_at + 64),
            "mapper": another_mapper,
        }
        for what, forge in forgeries.items():
            monkeypatch.setattr(server_link, "announce", lambda shm, single, forge=forge: forge(real(shm, single)))
            with two_servers.client(0, shm=True, partitioner=FixedShardsPartitioner(1)) as c:
                c.register(f"owner.{what}", np.zeros_like(big), rule="sum")
                np.testing.assert_array_equal(c.push_pull(f"owner.{what}", big), big)
                np.testing.assert_array_equal(c.push_pull(f"owner.{what}", big), 2 * big)
                assert [link.segment.single_copy for link in c.links if link.segment is not None] == [False], what
        with two_servers.client(0, shm=True, partitioner=FixedShardsPartitioner(1)) as c:
            c.register("owner.unasked", np.zeros_like(big), rule="sum")
            c.pull("owner.unasked")  # maps the segment, without single copy (the announcement is still forged)
            (segment,) = [link.segment for link in c.links if link.segment is not None]
            segment.single_copy = True  # the client pretends it was granted
            with pytest.raises(PeerLostError, match=r"closed the connection|was lost"):
                c.push_pull("owner.unasked", big)
    finally:
        for proc in [other, *mappers]:
            proc.kill()
            proc.wait()
    monkeypatch.setattr(server_link, "announce", real)
    with two_servers.client(0, shm=True, partitioner=FixedShardsPartitioner(1)) as c:
        c.register("owner.after", np.zeros_like(big), rule="sum")
        np.testing.assert_array_equal(c.push_pull("owner.after", big), big)  # the servers serve on
        server = c.placement("owner.after")[0][2]
        segment = c.links[server].segment
        assert segment is not None and segment.single_copy
        bigger = np.arange(1 << 20, dtype=np.float32)  # 4 MiB, 2 MiB per server: single copy needs no larger segment
        c.register("owner.bigger", np.zeros_like(bigger), rule="sum", partitioner=FixedShardsPartitioner(2))
        np.testing.assert_array_equal(c.push_pull("owner.bigger", bigger), bigger)
        np.testing.assert_array_equal(c.pull("owner.bigger"), bigger)
        assert c.links[server].segment is segment and segment.size < bigger.nbytes // 2


def test_no_room_in_dev_shm_falls_back_to_tcp(two_servers, monkeypatch):
    import errno

    from hora.ps.segment import Segment

    def full(size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Segment, "create", staticmethod(full))
    with two_servers.client(0, shm=True) as c:
        c.register("fallback.w", np.arange(6, dtype=np.float32), rule="sum")
        np.testing.assert_array_equal(c.push_pull("fallback.w", np.ones(6, np.float32)), np.arange(1, 7))


def test_a_large_registration_after_shared_memory_is_in_use_does_not_stall(two_servers):
    # the servers wait on the segments' doorbells, not the sockets: a control message larger than the sockets'
    # buffers must be announced first, or both sides block in send
    with two_servers.client(0, shm=True, partitioner=FixedShardsPartitioner(2)) as c:
        c.register("doorbell.small", np.zeros(4, np.float32), rule="sum")
        np.testing.assert_array_equal(c.push_pull("doorbell.small", np.ones(4, np.float32)), np.ones(4))
        big = np.arange(16 << 20, dtype=np.float32).reshape(-1, 64)  # 32 MiB to each server over its socket
        c.register("doorbell.big", big, rule="sum")
        np.testing.assert_array_equal(c.pull_rows("doorbell.big", [3, 3, len(big) - 1]), big[[3, 3, -1]])


def test_a_segment_that_cannot_grow_sends_larger_requests_over_tcp(two_servers, monkeypatch):
    import errno

    from hora.ps.segment import Segment

    with two_servers.client(0, shm=True, partitioner=FixedShardsPartitioner(1)) as c:
        c.register({"grow.small": np.zeros(4, np.float32), "grow.big": np.zeros(1 << 19, np.float32)}, rule="sum")
        np.testing.assert_array_equal(c.push_pull("grow.small", np.ones(4, np.float32)), np.ones(4))

        def full(size):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(Segment, "create", staticmethod(full))
        big = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: more than the 1 MiB segment holds
        np.testing.assert_array_equal(c.push_pull("grow.big", big), big)
        np.testing.assert_array_equal(c.push_pull("grow.small", np.ones(4, np.float32)), np.full(4, 2))
        np.testing.assert_array_equal(c.pull_rows("grow.big", [5, 1]), [5, 1])
