"""Every collective x dtype x root against numpy, on 1-4 real ranks, over shared memory and TCP."""

from __future__ import annotations

import pytest

import hora.numpy as hvd
from support.harness import run_ranks
from workers.collectives import (
    allgather_worker,
    allreduce_worker,
    alltoall_worker,
    async_order_worker,
    broadcast_worker,
    grouped_worker,
    join_worker,
    object_worker,
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


@pytest.mark.parametrize(("np_", "settings"), LAYOUTS)
@pytest.mark.parametrize(
    "worker",
    [allreduce_worker, allgather_worker, broadcast_worker, alltoall_worker, reducescatter_worker, async_order_worker,
     object_worker, grouped_worker],
    ids=lambda f: f.__name__.removesuffix("_worker"),
)
def test_collective(worker, np_, settings):
    results = run_ranks(worker, np_, **settings)
    assert len(results) == np_
    assert all(results), results


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_join_contributes_zeros_and_returns_last_rank(np_, op):
    assert run_ranks(join_worker, np_, int(op)) == [np_ - 1] * np_


@pytest.mark.parametrize("np_", [1, 3])
def test_topology_and_exported_variables(np_):
    infos = run_ranks(topology_worker, np_)
    for r, info in enumerate(infos):
        assert (info["rank"], info["size"], info["local_rank"], info["local_size"]) == (r, np_, r, np_)
        assert (info["cross_rank"], info["cross_size"], info["homogeneous"]) == (0, 1, True)
        env = info["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(r), str(np_), str(r), str(np_))
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == (
            str(r), str(np_), str(r), str(np_))
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"], env["HOROVOD_HOSTNAME"]) == ("0", "1", "localhost")


def test_process_sets_in_hora_numpy():
    from workers.collectives import process_set_worker

    assert run_ranks(process_set_worker, 4, timeout=120) == [True] * 4
