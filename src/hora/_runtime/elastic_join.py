"""A rank of an elastic job finding its place in the current round, and rank 0 hearing about host changes.

The elastic launcher (:mod:`hora.runner.elastic`) numbers the sets of ranks it forms: round 1 at the start, one
more after every reset. It publishes each round at the rendezvous store, under ``<job>/elastic/``: every member's
assignment at ``r<N>/<slot>`` (rank, size, local and cross rank and size; or ``{"removed": true}``), then ``round``
= N. A worker is a *slot* (``host:index``, ``HORA_ELASTIC_SLOT``) for its whole life. Its first ``init()`` joins
the latest round from the one it was started in; every later one (after ``shutdown()``, in ``hvd.elastic.run``'s
reset) first says it has left its round (``ready/<slot>`` = that round, Horovod's READY), then waits for a newer
round that names it. The group is assembled under keys of that round (``e<N>``), so a reset never meets stale
addresses; when a member dies before the group is assembled, the launcher says so (``failed/r<N>``) and the others
stop waiting for it (:class:`RoundWatch`).

Host-update notices (``notices`` = their count, ``notice/<i>`` = the update flags) are read by a thread on rank 0
and handed to the registered elastic states, which raise :class:`~hora.errors.HostsUpdatedInterrupt` at the next
``commit()`` on every rank.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from hora._runtime.bootstrap import Bootstrap
from hora._runtime.rendezvous import MissingKeys, RendezvousClient
from hora.config import Config
from hora.config.variables import read
from hora.config.worker_env import topology_env
from hora.errors import ConfigError, HoraError, RendezvousError

__all__ = [
    "HostUpdateResult",
    "Membership",
    "NoticeListener",
    "RoundWatch",
    "WorkerNotifications",
    "WorkerRemovedError",
    "join",
    "leave_on_sigterm",
    "notifications",
]

log = logging.getLogger("hora")

#: The round this process joined last (None before its first init).
_last_round: int | None = None
#: This worker got SIGTERM (a preemption): it leaves the job at its next commit.
_leaving = False


class HostUpdateResult(enum.IntFlag):
    """What changed in the job's hosts (Horovod's flags): hosts were removed, added, or both."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class _Listener(Protocol):
    def on_hosts_updated(self, timestamp: int, update_res: HostUpdateResult) -> None: ...


class WorkerNotifications:
    """Where host-update notices for this process arrive, handed to every registered state (Horovod's
    ``WorkerNotificationManager``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[_Listener] = []

    def register_listener(self, listener: _Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: _Listener) -> None:
        with self._lock:
            self._listeners = [s for s in self._listeners if s is not listener]

    def handle_hosts_updated(self, timestamp: int, update: HostUpdateResult) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update)


notifications = WorkerNotifications()


class WorkerRemovedError(HoraError):
    """The elastic launcher formed a round without this worker (its host was removed or blacklisted)."""


@dataclass(frozen=True)
class Membership:
    """This worker's place in one round."""

    round: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    notices: int  # host-update notices published before this round (rank 0 listens for later ones)


def _store(config: Config, boot: Bootstrap, rank: int, connect_within: float) -> RendezvousClient:
    """A connection to the elastic launcher's keys at the job's store."""
    return RendezvousClient(
        boot.addr,
        boot.port,
        boot.secret,
        rank,
        f"{boot.job_id}/elastic/",
        time.monotonic() + connect_within,
        config.max_frame_bytes,
    )


def _slot() -> str:
    slot = read("HORA_ELASTIC_SLOT")
    if not slot:
        raise ConfigError(
            "HOROVOD_ELASTIC=1 but HORA_ELASTIC_SLOT is not set: elastic ranks must be started by an elastic "
            "launcher (hora run --min-np/--max-np/--host-discovery-script), not by hand"
        )
    return slot


def join(config: Config, boot: Bootstrap) -> Membership:
    """Find this worker's place in the newest round that names it (after saying it left its last one).

    Raises:
        WorkerRemovedError: the launcher formed the next round without this worker.
        RendezvousError: no round named this worker within ``elastic_timeout`` seconds, or the launcher is gone.
    """
    global _last_round
    slot = _slot()
    store = _store(config, boot, -1, config.start_timeout)
    try:
        if _last_round is None:
            want = int(read("HORA_ELASTIC_ROUND") or "1")
        else:
            store.set(f"ready/{slot}", str(_last_round))
            want = _last_round + 1
        deadline = time.monotonic() + config.elastic_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                current = int(store.wait(["round"], max(left, 0.0), at_least=want)["round"])
            except MissingKeys:
                raise RendezvousError(
                    f"worker {slot} waited {config.elastic_timeout:g}s for the elastic launcher to form round {want} "
                    "and it did not: too few slots (--min-np) became available, or the launcher is stuck. Raise "
                    "--elastic-timeout (HOROVOD_ELASTIC_TIMEOUT) to wait longer."
                ) from None
            raw = store.get(f"r{current}/{slot}")
            if raw is None:  # a round formed without this (new) worker: wait for the next one
                want = current + 1
                continue
            data: dict[str, Any] = json.loads(raw)
            if data.get("removed"):
                if _leaving:  # it was asked to go, and now it may
                    _end_as_sigterm()
                raise WorkerRemovedError(f"worker {slot} has been removed from the elastic job (round {current})")
            _last_round = current
            values = {k: int(data[k]) for k in _FIELDS}
            member = Membership(current, notices=int(data.get("notices", 0)), **values)
            _export(member)
            return member
    finally:
        store.close()


_FIELDS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


class RoundWatch:
    """Whether the launcher called off the start-up of round ``round_`` (``failed/r<N>``: a member of it died
    before the group was assembled), for the assembly's waits (:class:`hora._runtime.peers.StoreDirectory`)."""

    def __init__(self, config: Config, boot: Bootstrap, round_: int) -> None:
        self._key = f"failed/r{round_}"
        self._store = _store(config, boot, -1, config.start_timeout)

    def failed(self) -> str | None:
        return self._store.get(self._key)

    def close(self) -> None:
        self._store.close()


def leave_on_sigterm(config: Config, boot: Bootstrap) -> None:
    """Make SIGTERM (a preemption notice) a graceful leave: the worker tells the launcher, which drains its host;
    every rank raises ``HostsUpdatedInterrupt`` at the next ``commit()`` and the job re-forms without it and without
    a rollback. When the launcher is stopping the whole job (``stopping`` at the store), or cannot be reached, the
    worker ends at once, as SIGTERM would end it. Only in the main thread, and only when the script has no SIGTERM
    handler of its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    slot = _slot()
    end_now = threading.Event()

    def announce() -> None:
        try:
            store = _store(config, boot, -1, min(config.start_timeout, 10.0))
            try:
                if store.get("stopping") is None:
                    store.set(f"leaving/{slot}", str(_last_round))
                    log.warning("SIGTERM: worker %s leaves the job at its next commit()", slot)
                    return
            finally:
                store.close()
        except HoraError:
            pass  # the launcher is gone: nobody to leave gracefully to
        end_now.set()
        os.kill(os.getpid(), signal.SIGTERM)  # the handler, in the main thread, ends the process

    def on_sigterm(signum: int, frame: object) -> None:
        global _leaving
        if end_now.is_set():
            _end_as_sigterm()
        if not _leaving:
            _leaving = True
            threading.Thread(target=announce, name="hora-elastic-leave", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)


def _end_as_sigterm() -> None:
    """End this process as SIGTERM would have, had hora not caught it (main thread only)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the signal is delivered meanwhile


def _export(member: Membership) -> None:
    """Update the topology variables, as Horovod's reset does, for scripts that read them."""
    topology_env(
        None,
        member.rank,
        member.size,
        member.local_rank,
        member.local_size,
        member.cross_rank,
        member.cross_size,
    )


class NoticeListener:
    """On rank 0: waits for host-update notices at the store and hands them to :data:`notifications`."""

    def __init__(self, config: Config, boot: Bootstrap, after: int) -> None:
        self._seen = after
        self._store = _store(config, boot, 0, config.start_timeout)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hora-elastic-notices", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            try:
                count = int(self._store.wait(["notices"], 60.0, at_least=self._seen + 1)["notices"])
                for i in range(self._seen + 1, count + 1):
                    raw = self._store.get(f"notice/{i}")
                    if raw is not None:
                        notifications.handle_hosts_updated(i, HostUpdateResult(int(json.loads(raw)["update"])))
                self._seen = count
            except MissingKeys:
                continue
            except (RendezvousError, ValueError, KeyError) as exc:
                if not self._closed:
                    log.warning("stopped listening for host updates from the elastic launcher: %s", exc)
                return

    def close(self) -> None:
        self._closed = True
        self._store.close()
        self._thread.join(5.0)
