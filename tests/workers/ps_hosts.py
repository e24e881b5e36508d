"""The worker of the multi-host parameter-server test: ``python -c`` runs :func:`main` under ``hora run -H a,b
--ps-per-host 1``; it prints one JSON line with what it saw."""

from __future__ import annotations

import json
import os

import numpy as np

STEPS = 3
LR = 0.5


def grad(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng(100 * step + rank).standard_normal((6, 4))


def reference(size: int) -> np.ndarray:
    """The sync result in one process: each step the mean of the workers' gradients, summed in rank order."""
    w = np.zeros((6, 4))
    for step in range(STEPS):
        acc = grad(step, 0).copy()
        for r in range(1, size):
            acc += grad(step, r)
        w -= LR * (acc / size)
    return w


def main() -> None:
    import hora.numpy as hvd
    import hora.ps
    from hora._runtime import context
    from hora.ps.directory import open_store, server_info

    hvd.init()
    config = context.current().config
    store, _ = open_store(config, hvd.rank())
    try:
        servers = server_info(store, config.num_ps, 30.0)
    finally:
        store.close()
    with hora.ps.connect(consistency="sync", partitioner=hora.ps.FixedShardsPartitioner(2)) as ps:
        ps.register("w", np.zeros((6, 4)), rule={"rule": "sgd", "lr": LR})
        ps.register("v", np.zeros((8, 3), np.float32), rule="sum")
        for step in range(STEPS):
            w = ps.push_pull("w", grad(step, hvd.rank()))
            v = ps.push_pull("v", np.full((8, 3), hvd.rank() + 1, np.float32))
        ids = np.array([hvd.rank(), 7, 7])  # the duplicate is summed on the worker: row 7 gets 2 per worker
        ps.push_rows("v", ids, np.ones((3, 3), np.float32))
        rows = ps.pull_rows("v", np.arange(8))
        out = {
            "rank": hvd.rank(), "size": hvd.size(), "host": os.environ["HORA_HOSTNAME"],
            "net_ns": os.readlink("/proc/self/ns/net"),
            "w": w.tolist(), "v": v.tolist(), "rows": rows.tolist(), "reference": reference(hvd.size()).tolist(),
            "placement": {name: [s for _, _, s in ps.placement(name)] for name in ("w", "v")},
            "shm": ps.shared_memory, "servers": servers,
            "server_net_ns": [_net_ns(int(s["pid"])) for s in servers],
        }  # fmt: skip
    hvd.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def _net_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError as exc:
        return f"unreadable: {exc}"


def killed_server() -> None:
    """Rank 0 SIGKILLs server 0 (on its own host) after a step; the next step of a rank must fail naming it."""
    import signal
    import time

    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    ps = hora.ps.connect(consistency="bounded(1)", partitioner=hora.ps.FixedShardsPartitioner(2))
    ps.register("emb", np.zeros((64, 8), np.float32), rule="sgd")
    ps.push_pull("emb", np.ones((64, 8), np.float32))
    if hvd.rank() == 0:
        from workers.ps import _server_pid

        pid = _server_pid(0)
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):  # gone (reaped by its agent, or a zombie) before this rank steps again
            time.sleep(0.05)
    for _ in range(100_000):
        ps.push_pull("emb", np.ones((64, 8), np.float32))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z" not in f.read()
    except OSError:
        return False
