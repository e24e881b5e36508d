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
