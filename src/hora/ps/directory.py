"""How workers find the servers: each server publishes its address at the job's rendezvous store, under keys
namespaced by the job id and attempt (``<job>/<attempt>/ps/<index>``), and the workers wait for all of them. A
restarted server publishes again, also under ``<index>@<generation>``; the launcher publishes
``{"failed": reason}`` there when it gives a dead server up."""

from __future__ import annotations

import json
import time
from typing import Any

from hora._runtime.bootstrap import read_secret
from hora._runtime.rendezvous import MissingKeys, RendezvousClient
from hora.config import Config
from hora.errors import ConfigError, RendezvousError

__all__ = ["open_store", "publish", "server_addresses", "server_info"]


def open_store(config: Config, rank: int) -> tuple[RendezvousClient, bytes]:
    """A client of the job's store (``hora run`` hands its address out) and the job secret."""
    secret = read_secret(config)
    if not config.rendezvous_addr or not config.rendezvous_port or secret is None:
        raise ConfigError(
            "parameter servers need the job's rendezvous store and secret, which hora run provides: start the job "
            "with 'hora run -np N --num-ps S ...'"
        )
    prefix = f"{config.job_id}/{config.attempt}/ps/"
    deadline = time.monotonic() + config.start_timeout
    store = RendezvousClient(config.rendezvous_addr, config.rendezvous_port, secret, rank, prefix, deadline)
    return store, secret


def publish(
    store: RendezvousClient,
    index: int,
    host: str,
    port: int,
    pid: int,
    hostname: str = "",
    generation: int = 0,
) -> None:
    """Server ``index`` listens at ``host:port`` on host ``hostname``; ``generation`` counts its restarts
    (``<index>@<generation>`` is the key a worker waits on for a restarted server, :mod:`hora.ps.reconnect`)."""
    value = json.dumps(
        {"host": host, "port": port, "pid": pid, "hostname": hostname, "generation": generation}
    )
    store.set(f"{index}@{generation}", value)
    store.set(str(index), value)


def server_addresses(store: RendezvousClient, num_ps: int, timeout: float) -> list[tuple[str, int]]:
    """The address of every server, waiting up to ``timeout`` seconds for them to start."""
    return [(str(info["host"]), int(info["port"])) for info in server_info(store, num_ps, timeout)]


def server_info(store: RendezvousClient, num_ps: int, timeout: float) -> list[dict[str, Any]]:
    """What every server published (``host``, ``port``, ``pid``, ``hostname``), waiting up to ``timeout`` seconds
    for them to start."""
    keys = [str(i) for i in range(num_ps)]
    try:
        values = store.wait(keys, timeout)
    except MissingKeys as exc:
        raise RendezvousError(
            f"parameter server(s) {', '.join(exc.missing)} did not start within {timeout:g}s (HORA_START_TIMEOUT); "
            "see their output, prefixed [ps<i>]"
        ) from None
    return [json.loads(values[k]) for k in keys]
