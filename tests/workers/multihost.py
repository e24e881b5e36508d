"""Rank functions for the multi-host tests (tests/multiprocess/runner/test_ssh.py): importable by name on every "host"."""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import hora.numpy as hvd
from workers.collectives import (
    allgather_worker,
    allreduce_worker,
    alltoall_worker,
    broadcast_worker,
    object_worker,
    reducescatter_worker,
    topology_worker,
)


def suite_worker() -> dict:
    """The representative collective suite, one fresh group per collective, plus where this rank ran."""
    results = {}
    for fn in (allreduce_worker, allgather_worker, broadcast_worker, alltoall_worker, reducescatter_worker,
               object_worker):
        results[fn.__name__] = fn()
    hvd.init()
    from hora._runtime.context import current

    ctx = current()
    results["where"] = {"host": ctx.hostname, "transport": ctx.transport, "bind": ctx.bind_addr,
                        "hosts": sorted({p.host for p in ctx.peers}), "pid_ns": os.readlink("/proc/self/ns/net")}
    hvd.shutdown()
    return results


def placement_worker() -> dict:
    """Topology, plus the address this rank bound and the transport it chose."""
    info = topology_worker()
    hvd.init()
    from hora._runtime.context import current

    ctx = current()
    info.update(host=ctx.hostname, bind=ctx.bind_addr, transport=ctx.transport,
                net_ns=os.readlink("/proc/self/ns/net"), hora_hostname=os.environ.get("HORA_HOSTNAME"))
    hvd.shutdown()
    return info


def killed_on_second_host_worker() -> None:
    """Rank size-1 (on the last host) SIGKILLs itself after a first allreduce; the others wait in the second."""
    hvd.init()
    hvd.allreduce(np.ones(4), op=hvd.Sum, name="warm-up")
    if hvd.rank() == hvd.size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    hvd.allreduce(np.ones(4), op=hvd.Sum, name="never-completes")


def secret_worker(directory: str) -> bool:
    """Write this rank's job secret where the test finds it, then wait until the test has scanned /proc."""
    hvd.init()
    tmp = os.path.join(directory, f"secret.{hvd.rank()}.tmp")
    with open(tmp, "w") as f:
        f.write(os.environ["HORA_SECRET"])
    os.replace(tmp, os.path.join(directory, f"secret.{hvd.rank()}"))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(directory, "go")):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.05)
    hvd.allreduce(np.ones(1), op=hvd.Sum)
    hvd.shutdown()
    return True


def ports_worker() -> list[int]:
    """The listener port every rank advertised at the rendezvous."""
    hvd.init()
    from hora._runtime.context import current

    ports = [p.port for p in current().peers]
    hvd.allreduce(np.ones(2), op=hvd.Sum)
    hvd.shutdown()
    return ports
