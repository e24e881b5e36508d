"""The response cache and the fusion planner: pure logic, tested in-process."""

from __future__ import annotations

import random

from hora._dtypes import ReduceOp
from hora._engine.cache import ResponseCache, cacheable
from hora._engine.fusion import nbytes, plan
from hora._engine.messages import Kind, Request, Response


def ar(name, shape=(4,), dtype="float32", op=ReduceOp.SUM, pre=1.0, post=1.0):
    return Request(Kind.ALLREDUCE, name, dtype, shape, op, -1, pre, post)


# -- cache --------------------------------------------------------------------------------------------------------
def test_hit_miss_and_changed_request():
    cache = ResponseCache(4)
    assert cache.lookup(ar("a")) == (-1, False)
    assert cache.put(Response(ar("a")), ar("a")) is None
    assert cache.lookup(ar("a")) == (0, True)
    assert cache.lookup(ar("a", shape=(5,))) == (0, False)  # same name, new shape: the slot must be invalidated
    assert cache.lookup(ar("a", dtype="float64")) == (0, False)
    assert cache.response(0).request.name == "a"


def test_own_request_decides_the_hit():
    # allgather: the shared response comes from rank 0's request; this rank's own first dimension differs
    cache = ResponseCache(2)
    first = Request(Kind.ALLGATHER, "g", "int32", (3, 2))
    mine = Request(Kind.ALLGATHER, "g", "int32", (5, 2))
    cache.put(Response(first, first_dims=[3, 5]), mine)
    assert cache.lookup(mine) == (0, True)
    assert cache.lookup(first) == (0, False)


def test_lru_eviction_is_deterministic_and_reports_the_slot():
    def run():
        cache = ResponseCache(3)
        events = []
        for n in "abc":
            events.append(cache.put(Response(ar(n)), ar(n)))
        cache.touch(cache.lookup(ar("a"))[0])  # b is now the least recently used
        events.append(cache.put(Response(ar("d")), ar("d")))
        events.append(cache.lookup(ar("b")))
        events.append(cache.lookup(ar("d")))
        return events

    events = run()
    assert events == [None, None, None, 1, (-1, False), (1, True)]
    assert run() == events  # same calls, same slots: what every rank relies on


def test_evict_frees_the_lowest_slot_first():
    cache = ResponseCache(4)
    for n in "abcd":
        cache.put(Response(ar(n)), ar(n))
    cache.evict(2)
    cache.evict(1)
    assert len(cache) == 2
    cache.put(Response(ar("x")), ar("x"))
    assert cache.lookup(ar("x")) == (1, True)
    cache.evict(7)  # unknown slot: nothing happens


def test_put_of_a_known_name_refreshes_in_place():
    cache = ResponseCache(2)
    cache.put(Response(ar("a")), ar("a"))
    cache.put(Response(ar("a", shape=(9,))), ar("a", shape=(9,)))
    assert len(cache) == 1
    assert cache.lookup(ar("a", shape=(9,))) == (0, True)


def test_what_is_cacheable():
    assert cacheable(Response(ar("grad.w")))
    assert not cacheable(Response(ar("allreduce.noname.3")))
    assert not cacheable(Response(ar("w"), error="boom"))
    assert not cacheable(Response(ar("w"), joined=[1]))
    assert not cacheable(Response(Request(Kind.JOIN, "join")))
    assert cacheable(Response(Request(Kind.BARRIER, "hora.barrier")))  # one name: answered from the cache
    assert cacheable(Response(Request(Kind.BROADCAST, "p", "float32", (3,), root=0)))


# -- fusion -------------------------------------------------------------------------------------------------------
def test_compatible_allreduces_fuse_up_to_the_threshold():
    rs = [Response(ar(f"t{i}", shape=(256,))) for i in range(5)]  # 1 KiB each
    assert plan(rs, 3 * 1024) == [[0, 1, 2], [3, 4]]
    assert plan(rs, 0) == [[i] for i in range(5)]  # 0 disables fusion
    assert plan(rs, 1 << 20) == [[0, 1, 2, 3, 4]]


def test_look_ahead_past_what_cannot_join():
    rs = [
        Response(ar("a")),
        Response(ar("b", dtype="float64")),
        Response(Request(Kind.BROADCAST, "c", "float32", (4,), root=0)),
        Response(ar("d")),
        Response(ar("e", op=ReduceOp.MAX)),
        Response(ar("f", pre=0.5)),
        Response(ar("g", dtype="float64")),
        Response(ar("h"), error="mismatch"),
        Response(ar("i"), joined=[1]),
        Response(ar("j")),
    ]
    assert plan(rs, 1 << 20) == [[0, 3, 9], [1, 6], [2], [4], [5], [7], [8]]


def test_a_tensor_larger_than_the_threshold_runs_alone():
    rs = [Response(ar("small")), Response(ar("big", shape=(1 << 20,))), Response(ar("small2"))]
    assert plan(rs, 1024) == [[0, 2], [1]]


def test_random_plans_cover_every_response_once_and_respect_the_threshold():
    rng = random.Random(7)
    dtypes = ["float32", "float64", "int32", "float16"]
    for _ in range(200):
        rs = [
            Response(ar(f"t{i}", shape=(rng.randint(0, 300),), dtype=rng.choice(dtypes)))
            for i in range(rng.randint(0, 40))
        ]
        threshold = rng.choice([0, 64, 1000, 4096, 1 << 20])
        groups = plan(rs, threshold)
        flat = sorted(i for g in groups for i in g)
        assert flat == list(range(len(rs)))
        for g in groups:
            assert len({rs[i].request.dtype for i in g}) == 1
            if len(g) > 1:
                assert sum(nbytes(rs[i]) for i in g) <= threshold
            assert g == sorted(g)  # members keep their relative order
