"""A worker's way back to a parameter server that ``hora run --max-restarts`` restarted.

When a connection to server ``i`` breaks, :meth:`Restarts.recover` waits at the job's store for the next
generation of that server (``<i>@<g+1>``, published by the restarted server once it has restored its checkpoint),
connects and authenticates to it, and the client then runs the failed operation again, whole, on the new server. It
waits at most ``timeout`` seconds (``HORA_START_TIMEOUT`` plus the op timeout's margin); when the launcher gave the
server up (``--max-restarts`` used up) or the time is over, it raises :class:`PeerLostError` naming the server, its
shards and why.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from hora._runtime.auth import Role
from hora._runtime.rendezvous import MissingKeys, connect_with_retry
from hora.config import Config
from hora.errors import HoraError, PeerLostError
from hora.ps.directory import open_store

if TYPE_CHECKING:
    from hora.ps.server_links import ServerLinks

__all__ = ["Restarts"]

log = logging.getLogger(__name__)


class Restarts:
    """Finds restarted servers for one client (``config``: the job's settings; ``rank``: the worker)."""

    def __init__(self, config: Config, rank: int, timeout: float) -> None:
        self._config = config
        self._rank = rank
        self.timeout = timeout
        self.generations: dict[int, int] = {}
        self.count = 0  # reconnections so far

    def recover(self, links: ServerLinks, server: int, what: str, exc: BaseException) -> None:
        """Replace the connection to ``server`` by one to its restarted process, or raise PeerLostError."""
        link = links[server]
        link.drop()  # the old process is gone, and the new one never maps the old segment
        deadline = time.monotonic() + self.timeout
        log.warning(
            "%s was lost (%s); waiting up to %gs for its restart (--max-restarts)", what, exc, self.timeout
        )
        try:
            store, secret = open_store(self._config, self._rank)
        except HoraError as err:
            raise PeerLostError(
                _give_up(links, server, what, exc, f"the job's store cannot be reached ({err})")
            ) from exc
        try:
            if server not in self.generations:  # which generation did this client first connect to?
                latest = json.loads(store.get(str(server)) or "{}")
                same = (latest.get("host"), latest.get("port")) == tuple(link.address)
                self.generations[server] = int(latest.get("generation", 0)) - (0 if same else 1)
            while True:
                generation = self.generations[server] + 1
                info = self._next(store, links, server, generation, deadline)
                if info is None:
                    reason = f"it was not restarted within {self.timeout:g}s (HORA_START_TIMEOUT)"
                    raise PeerLostError(_give_up(links, server, what, exc, reason)) from exc
                self.generations[server] = generation
                if "failed" in info:
                    raise PeerLostError(_give_up(links, server, what, exc, str(info["failed"]))) from exc
                host, port = str(info["host"]), int(info["port"])
                soon = min(deadline, time.monotonic() + 5.0)
                what_now = f"parameter server {server} (restart {generation})"
                try:
                    sock = connect_with_retry(host, port, secret, Role.PS, self._rank, soon, what_now)
                except HoraError:  # died again before we got there: wait for the next generation
                    continue
                link.replace(sock, (host, port))
                self.count += 1
                log.warning(
                    "reconnected to parameter server %d (restart %d) at %s:%d", server, generation, host, port
                )
                return
        finally:
            store.close()

    def published(
        self, server: int, address: tuple[str, int], exc: BaseException, deadline: float
    ) -> tuple[str, int]:
        """Server ``server`` could not be reached at ``address`` before this worker ever connected (``exc``): the
        address its restart published, once there is one (until ``deadline``, else ``address`` again).

        Raises:
            PeerLostError: the launcher gave the server up (``--max-restarts`` used up, its checkpoint unusable).
        """
        what = f"parameter server {server} at {address[0]}:{address[1]}"
        store, _ = open_store(self._config, self._rank)
        try:
            latest = json.loads(store.get(str(server)) or "{}")
            if (latest.get("host"), latest.get("port")) != tuple(address) and "host" in latest:
                return str(latest["host"]), int(latest["port"])  # restarted meanwhile
            info = self._next(store, None, server, int(latest.get("generation", 0)) + 1, deadline)
        finally:
            store.close()
        if info is None:
            return address
        if "failed" in info:
            raise PeerLostError(f"{what} was lost before this worker connected ({exc}); {info['failed']}") from exc
        log.warning("%s was lost before this worker connected (%s); trying its restart", what, exc)
        return str(info["host"]), int(info["port"])

    @staticmethod
    def _next(
        store: Any, links: ServerLinks | None, server: int, generation: int, deadline: float
    ) -> dict[str, Any] | None:
        """The published ``<server>@<generation>``, or None once ``deadline`` passed. Waits in 1 s slices: when
        another server is given up meanwhile, the client is broken and this wait ends with that error."""
        while True:
            if links is not None and links.lost is not None:
                raise PeerLostError(links.lost)
            left = deadline - time.monotonic()
            try:
                key = f"{server}@{generation}"
                return dict(json.loads(store.wait([key], max(min(left, 1.0), 0.0))[key]))
            except MissingKeys:
                if left <= 1.0:
                    return None


def _give_up(links: ServerLinks, server: int, what: str, exc: BaseException, reason: str) -> str:
    """Break every link as a lost server without restarts does (every connection shut), with ``reason``."""
    return links.lose(server, what, PeerLostError(f"{exc}; {reason}"))
