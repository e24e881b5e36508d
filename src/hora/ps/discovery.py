"""How a worker reaches the running job's parameter servers after ``init()``: :func:`connect` reads their addresses at
the job's store (:mod:`hora.ps.directory`) and opens a :class:`Client`; :func:`shared_client` is the one client of a
process that the frameworks' parameter-server optimizers share."""

from __future__ import annotations

import threading
from typing import Any

from hora._runtime import context
from hora.errors import ConfigError
from hora.ps.client import Client
from hora.ps.directory import open_store, server_info
from hora.ps.reconnect import Restarts

__all__ = ["connect", "shared_client"]

_lock = threading.Lock()
_shared: Client | None = None


def connect(**kwargs: Any) -> Client:
    """A new :class:`Client` to this job's servers (``hora run --num-ps S`` / ``--ps-per-host K``); needs ``init()``
    first.

    Keyword arguments go to :class:`Client` (``consistency`` defaults to ``HORA_PS_CONSISTENCY``; ``shm`` to shared
    memory with the servers of this worker's host: those that published its ``HORA_HOSTNAME``, or a loopback
    address).
    """
    ctx = context.current()
    config = ctx.config
    if config.num_ps < 1:
        raise ConfigError(
            "this job has no parameter servers: start it with 'hora run -np N --num-ps S ...' (HORA_NUM_PS), or "
            "'--ps-per-host K' on several hosts"
        )
    store, secret = open_store(config, ctx.rank)
    try:
        infos = server_info(store, config.num_ps, config.start_timeout)
    finally:
        store.close()
    addresses = [(str(i["host"]), int(i["port"])) for i in infos]
    kwargs.setdefault(
        "shm", [_loopback(h) or i.get("hostname") == ctx.hostname for i, (h, _) in zip(infos, addresses)]
    )
    kwargs.setdefault("consistency", config.ps_consistency)
    kwargs.setdefault("op_timeout", config.op_timeout)
    kwargs.setdefault("single_copy", config.ps_single_copy)
    if config.ps_max_restarts:  # hora run --max-restarts: wait for a restarted server instead of failing
        kwargs.setdefault("restarts", Restarts(config, ctx.rank, config.start_timeout + 30.0))
    return Client(addresses, secret, ctx.rank, **kwargs)


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def shared_client() -> Client:
    """One client per process, shared by every optimizer that uses the parameter-server strategy."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = connect()
        return _shared
