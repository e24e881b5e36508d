"""What every hora listener shares: handshakes that run concurrently, and rate-limited reports of dropped clients.

A listener accepts a connection and hands its handshake to a thread of its own, with a deadline of its own, so a
client that connects and says nothing (or trickles bytes) costs the real peers nothing: they are accepted and
authenticated beside it. :class:`PendingHandshakes` bounds how many unauthenticated connections are held at once
(the oldest is cut off first, so a flood cannot starve a real client that just arrived; also when the process runs
out of descriptors before that bound, as under a low ``ulimit -n``) and closes those still pending when the
listener shuts down. :class:`RejectLog` reports dropped connections at most once per interval,
so a local process cannot flood the user's output with a WARNING line per connection.
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["PendingHandshakes", "RejectLog"]

#: Unauthenticated connections held at once per listener; past it the oldest pending one is cut off.
MAX_PENDING = 64
#: Seconds between two WARNING reports of dropped connections (the others go to DEBUG, and are counted).
REPORT_INTERVAL = 30.0


class RejectLog:
    """Counts dropped connections and logs them: the first at WARNING, then at most one summary per interval."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        interval: float = REPORT_INTERVAL,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._log = log
        self._say = say  # where the loud reports go instead of the log (a process printing its own lines)
        self._what = what
        self._interval = interval
        self._lock = threading.Lock()
        self._last: float | None = None
        self._quiet = 0
        self.count = 0

    def drop(self, reason: object) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            loud = self._last is None or now - self._last >= self._interval
            if loud:
                self._last, quiet, self._quiet = now, self._quiet, 0
            else:
                self._quiet += 1
        if not loud:
            self._log.debug("%s: dropped a connection: %s", self._what, reason)
            return
        earlier = f" ({quiet} more dropped since the last report)" if quiet else ""
        if self._say is not None:
            self._say(f"{self._what}: {reason}{earlier}; further ones are reported at most every {self._interval:g}s")
            return
        self._log.warning(
            "%s: dropped a connection: %s%s; further ones are reported at most every %gs",
            self._what,
            reason,
            earlier,
            self._interval,
        )


class PendingHandshakes:
    """The connections a listener accepted whose handshake has not finished yet (see the module docstring)."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._pending: collections.OrderedDict[int, socket.socket] = collections.OrderedDict()
        self._closed = False

    def admit(self, conn: socket.socket) -> bool:
        """Track ``conn``; False (and ``conn`` is closed) once the listener is closing."""
        with self._lock:
            if self._closed:
                evict = [conn]
            else:
                self._pending[id(conn)] = conn
                evict = []
                while len(self._pending) > self._limit:
                    evict.append(self._pending.popitem(last=False)[1])
        for old in evict:
            _cut(old)  # its handshake thread sees the connection end and drops it
        return not (evict and evict[0] is conn)

    def make_room(self, exc: OSError) -> bool:
        """``accept()`` failed with ``exc``: when the process is out of descriptors, cut the oldest pending
        handshake (its thread closes it) so the next client can be accepted. True when one was cut."""
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            return False
        with self._lock:
            if not self._pending:
                return False
            old = self._pending.popitem(last=False)[1]
        _cut(old)
        return True

    def finish(self, conn: socket.socket) -> None:
        with self._lock:
            self._pending.pop(id(conn), None)

    def close(self) -> None:
        """Cut off every pending handshake; later :meth:`admit` calls refuse."""
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        for conn in pending:
            _cut(conn)


def _cut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
