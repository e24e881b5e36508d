"""A worker's links to every server of the job, used together: :class:`ServerLinks`.

An operation of the :class:`~hora.ps.client.Client` is a list of requests per server; each server's run in order on
its :class:`~hora.ps.server_link.ServerLink` (under the link's lock), the servers at the same time (one thread per
server beyond the first). A server that answers with a refusal raises its error; a server that is lost breaks
every link: the first loss shuts every connection down, so requests in flight on the others end now and those
servers count this worker as gone (nobody waits for it under bounded/sync), and every later operation raises the
same :class:`PeerLostError`, naming the server and the shards it held. With ``hora run --max-restarts`` a lost
server is waited for instead (:mod:`hora.ps.reconnect`) and the failed operation runs again, whole, on its restart.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from hora.errors import HoraError, PeerLostError, ProtocolError
from hora.ps.messages import ControlRequest, HotRequest
from hora.ps.server_link import OnReply, ServerLink

if TYPE_CHECKING:
    from hora.ps.reconnect import Restarts

__all__ = ["PerServer", "Request", "ServerLinks"]

Request = HotRequest | ControlRequest
#: Requests per server (each server's in order on its link, the servers at the same time).
PerServer = Mapping[int, Sequence[Request]]

#: Seconds a worker first tries a server's published address (``--max-restarts``) before it looks at the store
#: for the server's restart; a live server accepts at once (it publishes its address once it listens).
FIRST_TRY = 2.0


class ServerLinks:
    """The links to servers ``0..len-1``.

    Args:
        links: one per server, in server order (this object closes them).
        restarts: how to reach a restarted server (:mod:`hora.ps.reconnect`); None: a lost server is fatal.
        held: the shards a server holds, for the message when it is lost (``["'w' shard 1", ...]``).
    """

    def __init__(
        self, links: list[ServerLink], restarts: Restarts | None, held: Callable[[int], list[str]]
    ) -> None:
        self.links = links
        self.restarts = restarts
        self._held = held
        self.lost: str | None = None  # why every operation fails from now on
        self._lost_lock = threading.Lock()
        self._closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, len(links) - 1), thread_name_prefix="hora-ps"
        )

    @classmethod
    def open(
        cls,
        addresses: Sequence[tuple[str, int]],
        use_segment: Sequence[bool],
        secret: bytes,
        rank: int,
        timeout: float,
        op_timeout: float,
        single_copy: bool,
        restarts: Restarts | None,
        held: Callable[[int], list[str]],
    ) -> ServerLinks:
        """Connect to every server within ``timeout`` seconds; a reply may take ``op_timeout + timeout``. With
        ``restarts``, a server that is gone before this worker connected is looked for again at the store (its
        restart publishes a new address) every :data:`FIRST_TRY` seconds."""
        links: list[ServerLink] = []
        deadline = time.monotonic() + timeout
        io_timeout = op_timeout + timeout

        def connect(i: int, address: tuple[str, int]) -> ServerLink:
            while True:
                until = deadline if restarts is None else min(deadline, time.monotonic() + FIRST_TRY)
                try:
                    return ServerLink.open(i, address, secret, rank, until, io_timeout, use_segment[i], single_copy)
                except HoraError as exc:
                    if restarts is None or time.monotonic() >= deadline:
                        raise
                    address = restarts.published(i, address, exc, min(deadline, time.monotonic() + FIRST_TRY))

        try:
            for i, address in enumerate(addresses):
                links.append(connect(i, address))
        except BaseException:
            for link in links:
                link.close()
            raise
        return cls(links, restarts, held)

    def __len__(self) -> int:
        return len(self.links)

    def __getitem__(self, server: int) -> ServerLink:
        return self.links[server]

    def run(self, per: PerServer, on_reply: Callable[[int], OnReply] | None = None) -> None:
        """Run each server's requests in order on its link, the servers concurrently; ``on_reply(server)`` is
        given each control reply of that server. The first error (of the servers in ``per``'s order) is raised
        once every server is done."""
        items = [(s, reqs) for s, reqs in per.items() if reqs]
        if not items:
            return
        futures = [self._pool.submit(self._exchange, s, reqs, on_reply) for s, reqs in items[1:]]
        first_error: BaseException | None = None
        try:
            self._exchange(items[0][0], items[0][1], on_reply)
        except BaseException as exc:
            first_error = exc
        for f in futures:
            try:
                f.result()
            except BaseException as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def lose(self, server: int, what: str, exc: BaseException) -> str:
        """Break every link because ``server`` (``what``) was lost with ``exc``; returns the reason every
        operation fails with from now on (the first loss's)."""
        with self._lost_lock:
            if self.lost is None:
                held = self._held(server)
                self.lost = (
                    f"{what} was lost ({exc}); it held {', '.join(held[:20]) or 'no shards'}"
                    f"{' ...' if len(held) > 20 else ''}. Training cannot go on without it: restart the job"
                )
                for link in self.links:
                    link.shutdown()
            return self.lost

    def _exchange(
        self, server: int, reqs: Sequence[Request], on_reply: Callable[[int], OnReply] | None
    ) -> None:
        link = self.links[server]
        what = link.what
        with link.lock:
            if self.lost is not None:
                raise PeerLostError(self.lost)
            if self._closed:
                raise HoraError("this parameter-server client is closed")
            try:
                refusal = link.run(reqs, on_reply(server) if on_reply else None, lambda: self.lost)
            except (OSError, PeerLostError, ProtocolError) as exc:
                if self.restarts is None or self.lost is not None:  # no restarts, or another server is gone
                    raise PeerLostError(self.lose(server, what, exc)) from exc
                self.restarts.recover(self, server, what, exc)  # connected to its restart, or PeerLostError
            else:
                if refusal is not None:  # the server answered: the connection is fine
                    raise refusal.exception(what)
                return
        self._exchange(server, reqs, on_reply)  # the failed operation again, whole, on the restarted server

    def close(self) -> None:
        self._closed = True
        for link in self.links:
            link.close()
        self._pool.shutdown(wait=True)
