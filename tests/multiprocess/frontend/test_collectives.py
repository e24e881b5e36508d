"""Every collective x dtype x root against numpy, on 1-4 real ranks, over shared memory and TCP.

One launch per layout runs every part of the matrix (each collective's worker, join with Sum and Average, topology
and the exported variables, process sets at 4 ranks) one after another, each on a fresh group
(support/parts.py): a launch costs seconds, most parts a fraction of one. A failing part fails its layout's test
with the part's name, its rank and its traceback.
"""

from __future__ import annotations

import pytest

import hora.numpy as hvd
from support.harness import run_ranks
from support.parts import Part, parts_worker
from workers.collectives import (
    adasum_worker,
    allgather_worker,
    allreduce_worker,
    alltoall_worker,
    async_order_worker,
    broadcast_worker,
    express_worker,
    grouped_worker,
    join_worker,
    object_worker,
    process_set_worker,
    reducescatter_worker,
    topology_worker,
)

# (np, transport): one rank needs no transport; small chunk sizes force the multi-step paths with small tensors.
LAYOUTS = [
    pytest.param(1, {}, id="np1"),
    pytest.param(2, {"transport": "shm"}, id="np2-shm"),
    pytest.param(3, {"transport": "shm", "shm_chunk_bytes": 4096}, id="np3-shm-smallchunks"),
    pytest.param(4, {"transport": "shm"}, id="np4-shm"),
    pytest.param(2, {"transport": "tcp"}, id="np2-tcp"),
    pytest.param(3, {"transport": "tcp", "tcp_chunk_bytes": 4096}, id="np3-tcp-smallchunks"),
    pytest.param(4, {"transport": "tcp"}, id="np4-tcp"),
]


def _all_true(name: str, results: list, np_: int) -> None:
    assert all(results), (name, results)


def _last_rank(name: str, results: list, np_: int) -> None:
    """join() returns the last rank to join; join contributes zeros for ranks out of data (join_worker checks)."""
    assert results == [np_ - 1] * np_, (name, results)


def _topology(name: str, infos: list, np_: int) -> None:
    for r, info in enumerate(infos):
        assert (info["rank"], info["size"], info["local_rank"], info["local_size"]) == (r, np_, r, np_)
        assert (info["cross_rank"], info["cross_size"], info["homogeneous"]) == (0, 1, True)
        env = info["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(r), str(np_), str(r), str(np_))
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == (
            str(r), str(np_), str(r), str(np_))
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"], env["HOROVOD_HOSTNAME"]) == ("0", "1", "localhost")


def _express_used(name: str, counts: list, np_: int) -> None:
    """The express lane exists on shared memory with peers (none on TCP or one rank), took calls, and handed
    over the cycles where a peer needed more (the full rounds and the mismatch of express_worker)."""
    if counts[0][0] < 0:
        assert counts == [(-1, -1)] * np_, (name, counts)
        return
    assert all(calls > 0 for calls, _ in counts), (name, counts)
    assert any(handed > 0 for _, handed in counts), (name, counts)


#: Every layout's parts, and how each part's per-rank results are checked (each worker checks its own results too).
PARTS = [
    (Part("allreduce", allreduce_worker), _all_true),
    (Part("allgather", allgather_worker), _all_true),
    (Part("broadcast", broadcast_worker), _all_true),
    (Part("alltoall", alltoall_worker), _all_true),
    (Part("reducescatter", reducescatter_worker), _all_true),
    (Part("async_order", async_order_worker), _all_true),
    (Part("object", object_worker), _all_true),
    (Part("grouped", grouped_worker), _all_true),
    (Part("join-sum", join_worker, (int(hvd.Sum),)), _last_rank),
    (Part("join-average", join_worker, (int(hvd.Average),)), _last_rank),
    (Part("topology", topology_worker), _topology),
    (Part("adasum", adasum_worker), _all_true),
    (Part("express", express_worker), _express_used),
]
FOUR_RANKS = [(Part("process_sets", process_set_worker), _all_true)]  # two sets of two ranks


@pytest.mark.parametrize(("np_", "settings"), LAYOUTS)
def test_collectives(np_, settings):
    parts = PARTS + (FOUR_RANKS if np_ == 4 else [])
    results = run_ranks(parts_worker, np_, [part for part, _ in parts], timeout=240, **settings)
    assert len(results) == np_
    for part, check in parts:
        check(part.name, [r[part.name] for r in results], np_)
