"""Worker functions for the parameter-server tests run under ``hora run --num-ps``."""

from __future__ import annotations

import os

import numpy as np


def push_pull_worker(steps: int) -> dict:
    """Every rank adds its rank+1 to a sum variable each step (sync: all land before anyone reads)."""
    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    with hora.ps.connect(consistency="sync", partitioner=hora.ps.FixedShardsPartitioner(2)) as ps:
        ps.register("v", np.zeros((10, 3), np.float32), rule="sum")
        for _ in range(steps):
            value = ps.push_pull("v", np.full((10, 3), hvd.rank() + 1, np.float32))
        out = {"size": hvd.size(), "value": value.tolist(), "servers": ps.num_servers,
               "balance": ps.balance(), "placement": ps.placement("v")}
    hvd.shutdown()
    return out


def torch_ps_worker(steps: int, consistency: str | None) -> list[float]:
    """A linear model trained with DistributedOptimizer; the strategy comes from HORA_STRATEGY when the test sets
    it, else from the argument."""
    import torch

    import hora.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank())  # different initial values: the servers' (first registration's) win
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {} if consistency is None else {"strategy": "parameter_server", "consistency": consistency}
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)
        loss = (model(x) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    hvd.shutdown()
    return [*out, float(os.environ.get("HORA_NUM_PS", "0"))]


def torch_reference(steps: int, workers: int) -> list[float]:
    """The sync parameter-server result in one process: the average of the workers' gradients each step."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    gens = [torch.Generator().manual_seed(100 + r) for r in range(workers)]
    for _ in range(steps):
        grads = []
        for r in range(workers):
            m = torch.nn.Linear(4, 2)
            with torch.no_grad():
                for p, v in zip(m.parameters(), params):
                    p.copy_(torch.from_numpy(v))
            x = torch.randn(8, 4, generator=gens[r])
            (m(x) ** 2).sum().backward()
            grads.append([p.grad.numpy().copy() for p in m.parameters()])
        for i, v in enumerate(params):
            acc = grads[0][i].copy()
            for r in range(1, workers):
                acc += grads[r][i]
            np.divide(acc, workers, out=acc)
            v -= np.float32(0.1) * acc
    return np.concatenate([v.reshape(-1) for v in params]).tolist()


def _server_pid(index: int) -> int:
    """The pid of this job's parameter server ``index`` (found in /proc by its command line and job id)."""
    job = os.environ["HORA_JOB_ID"].encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"hora.ps" in argv and argv[argv.index(b"--index") + 1] == str(index).encode() and b"HORA_JOB_ID=" + job in env:
            return int(entry)
    raise RuntimeError(f"parameter server {index} not found")


def killed_server_worker() -> None:
    """Rank 0 SIGKILLs server 0 after a few steps; every rank must then raise naming it (the test reads stderr)."""
    import signal

    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    ps = hora.ps.connect(consistency="bounded(1)", partitioner=hora.ps.FixedShardsPartitioner(2))
    ps.register("emb", np.zeros((64, 8), np.float32), rule="sgd")
    for step in range(100_000):
        if hvd.rank() == 0 and step == 3:
            os.kill(_server_pid(0), signal.SIGKILL)
        ps.push_pull("emb", np.ones((64, 8), np.float32))


def _restart_grad(shape: tuple[int, ...], dtype: str, step: int, rank: int) -> np.ndarray:
    return np.sin(np.arange(int(np.prod(shape))) * 0.37 * (step + 1) + rank).reshape(shape).astype(dtype)


def restart_reference(variables: dict, placement: dict, workers: int, steps: int, kept: int, lost_to: int) -> dict:
    """The values the sync servers hold after ``steps`` steps when server 0 restored its checkpoint after ``kept``
    steps while it had applied ``lost_to``: its shards lose steps ``kept..lost_to-1``, the others lose nothing."""
    from hora.ps.rules import apply_dense, new_slots, parse_rule

    rule = parse_rule(RESTART_RULE)
    out = {}
    for name, (shape, dtype) in variables.items():
        value = np.zeros(shape, dtype)
        for lo, hi, server in placement[name]:
            part = value[lo:hi]
            slots = new_slots(rule, part.shape, part.dtype)
            t = 0
            for step in range(steps):
                if server == 0 and kept <= step < lost_to:
                    continue
                grads = [_restart_grad(shape, dtype, step, r)[lo:hi] for r in range(workers)]
                acc = grads[0].copy()
                for g in grads[1:]:
                    acc += g
                np.divide(acc, workers, out=acc)
                t += 1
                apply_dense(rule, part, acc, slots, t)
        out[name] = value
    return out


RESTART_RULE = {"rule": "adam", "lr": 0.05}


def restarted_server_worker(ckpt_dir: str, every: int, steps: int) -> None:
    """Sync training on 2 servers with ``--max-restarts 1``: rank 0 SIGKILLs server 0 once its checkpoint after
    ``every`` steps is on disk (at step ``every + 2``, so 2 applied steps are lost); training goes on through the
    restart and every rank prints its values and the reference's (``RESULT {...}``). Then rank 0 freezes the
    restarted server (SIGSTOP): the launcher kills it, has no restart left, and every worker must fail naming it."""
    import json
    import signal
    import time

    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    ps = hora.ps.connect(consistency="sync", partitioner=hora.ps.FixedShardsPartitioner(2))
    variables = {"a": ((8, 3), "float32"), "b": ((6,), "float64")}
    ps.register({n: np.zeros(s, d) for n, (s, d) in variables.items()}, rule=RESTART_RULE)
    placement = {n: ps.placement(n) for n in variables}
    kill_at = every + 2
    values = {}
    for step in range(steps):
        if step == kill_at:
            hvd.allreduce(np.zeros(1), name="before.kill")  # every rank finished step kill_at - 1
            if hvd.rank() == 0:
                manifest = os.path.join(ckpt_dir, "ps0", "server.json")
                for _ in range(600):  # the checkpoint after `every` steps is written in the background
                    try:
                        with open(manifest) as f:
                            saved = json.load(f)["shards"]
                        if saved and all(e["t"] >= every for e in saved):
                            break
                    except (OSError, ValueError):
                        pass
                    time.sleep(0.1)
                os.kill(_server_pid(0), signal.SIGKILL)
        for n, (s, d) in variables.items():
            values[n] = ps.push_pull(n, _restart_grad(s, d, step, hvd.rank()))
    expected = restart_reference(variables, placement, hvd.size(), steps, every, kill_at)
    same = {n: bool(np.array_equal(values[n], expected[n])) for n in variables}
    print("RESULT " + json.dumps({"same": same, "placement": placement, "reconnects": ps.restarts.count}), flush=True)
    hvd.allreduce(np.zeros(1), name="before.freeze")
    if hvd.rank() == 0:
        os.kill(_server_pid(0), signal.SIGSTOP)
    for step in range(100_000):
        for n, (s, d) in variables.items():
            ps.push_pull(n, _restart_grad(s, d, step, hvd.rank()))


def corrupt_checkpoint_worker(directory: str) -> None:
    """Server 0 checkpoints every update; after a few steps rank 0 damages its shard file and SIGKILLs it: the
    restart cannot restore, the launcher gives the server up, and every rank must fail at once naming why."""
    import glob
    import signal
    import time

    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    ps = hora.ps.connect(consistency="sync")
    ps.register("w", np.zeros(8, np.float32), rule="sgd")
    for step in range(100_000):
        if hvd.rank() == 0 and step == 3:
            # no update happens before this rank's next push (sync): once the saver has written step 2's
            # checkpoint (it writes in a thread of its own), nothing rewrites the damaged file
            time.sleep(1.0)
            for shard in glob.glob(os.path.join(directory, "ps0", "*.npz")):
                with open(shard, "wb") as f:
                    f.write(b"damaged")
            os.kill(_server_pid(0), signal.SIGKILL)
        ps.push_pull("w", np.ones(8, np.float32))


def lost_while_connecting_worker() -> float:
    """Rank 0 SIGKILLs server 0 as soon as it finds the process, before any worker connected (before or after the
    server published its address and wrote its first manifest: both happen): under --max-restarts the workers must
    find its restart, not retry the dead address until the start timeout, and a restart of a server that never
    served starts empty instead of missing a manifest it never had."""
    import signal

    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    if hvd.rank() == 0:
        os.kill(_server_pid(0), signal.SIGKILL)
    hvd.barrier()
    ps = hora.ps.connect(consistency="sync")  # most likely reads the dead server's address, its restart not up yet
    ps.register("w", np.zeros(4, np.float32), rule="sgd")
    for _ in range(3):
        value = ps.push_pull("w", np.ones(4, np.float32))
    return float(value[0])
