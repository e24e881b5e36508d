"""Horovod's elastic API, the framework-independent part (``horovod/common/elastic.py``): ``State``, ``ObjectState``
and the ``run`` loop every adapter's ``hvd.elastic.run`` is made of. An adapter adds its own state classes (model and
optimizer handlers) and nothing else.

The loop, as Horovod's: ``state.sync()`` (unless the last interrupt said to skip it), then ``func(state, ...)``; on
:class:`~hora.errors.HorovodInternalError` the state goes back to its last commit, on
:class:`~hora.errors.HostsUpdatedInterrupt` it stays as it is; then hora is reset (shutdown and init in the same
process: the ranks that are left, with their new ranks and size) and ``state.on_reset()`` runs the user's callbacks.

Differences from Horovod (docs/elastic.md): a :class:`~hora.errors.MismatchError` (the ranks called a collective
differently: a bug in the script that a reset cannot fix) is re-raised instead of looping until the reset limit; and
in a job that was not started elastic (no ``HOROVOD_ELASTIC=1`` from the launcher) a failed collective is re-raised
after the restore, saying so, instead of re-initializing into a rendezvous the lost rank never reaches.
"""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hora._frontend.surface import init, shutdown
from hora._runtime.elastic_join import HostUpdateResult, WorkerNotifications, WorkerRemovedError, notifications
from hora.config import Config, launchers
from hora.errors import HorovodInternalError, HostsUpdatedInterrupt, MismatchError, RendezvousError

__all__ = [
    "HostUpdateResult",
    "ObjectState",
    "State",
    "WorkerNotifications",
    "WorkerRemovedError",
    "notifications",
    "reset",
    "run",
    "run_fn",
]

F = TypeVar("F", bound=Callable[..., Any])


class State:
    """State kept in memory across the ranks of an elastic job (Horovod's ``State``): ``commit()`` saves it and
    checks for host updates, ``restore()`` goes back to the last commit, ``sync()`` makes every rank's copy rank
    0's. ``bcast_object(obj)`` broadcasts from rank 0; ``get_rank()`` is this process's rank."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[tuple[int, HostUpdateResult]] = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Functions to call after every reset (a rank was added or removed), e.g. to rescale the learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: HostUpdateResult) -> None:
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state in memory, then raise :class:`HostsUpdatedInterrupt` on every rank if hosts changed."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` if a host update arrived; rank 0 decides and every rank follows, so
        all raise at the same step."""
        last = prev = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= result
        prev, self._last_updated_timestamp, update = self._bcast_object((prev, last, update))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def save(self) -> None:
        """Save the state in memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Go back to the last saved state, undoing what was not committed."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Make every rank's state rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Called after a reset, before the sync (override to rebuild what depends on the size)."""


class ObjectState(State):
    """State made of plain picklable objects, given as keyword arguments and kept as attributes."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def run_fn(func: F, reset: Callable[[], None]) -> F:
    """``func(state, *args, **kwargs)`` under the elastic loop (see the module's docstring); ``reset`` restarts hora
    in this process."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        notifications.register_listener(state)
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except MismatchError:
                    raise
                except HorovodInternalError as exc:
                    state.restore()
                    skip_sync = False
                    if not launchers.elastic():  # HOROVOD_ELASTIC=1: an elastic launcher started this rank
                        raise type(exc)(
                            f"{exc} (hvd.elastic.run restored the last commit but cannot go on: this job was not "
                            "started elastic; start it with hora run --min-np/--max-np and --host-discovery-script "
                            "to continue with the ranks that are left)"
                        ) from exc
                except HostsUpdatedInterrupt as exc:
                    skip_sync = exc.skip_sync
                _reset_until_joined(reset)
                state.on_reset()
        finally:
            notifications.remove_listener(state)

    return wrapper  # type: ignore[return-value]


def _reset_until_joined(reset: Callable[[], None]) -> None:
    """``reset()``, again when the round it joined could not be assembled (a member of it died during start-up:
    the launcher forms another round). Being removed from the job, or no round within the elastic time-out, ends
    it."""
    deadline = time.monotonic() + Config.resolve().elastic_timeout
    while True:
        try:
            reset()
            return
        except (RendezvousError, HorovodInternalError):  # (not WorkerRemovedError: being removed ends it)
            if not launchers.elastic() or time.monotonic() > deadline:
                raise
            shutdown()


def reset() -> None:
    """Restart hora in this process with the job's current ranks (what Horovod's ``_reset`` does)."""
    shutdown()
    init()


def run(func: F) -> F:
    """Run ``func(state, *args, **kwargs)`` as elastic training (Horovod's ``hvd.elastic.run``): ranks may leave and
    join; after a failure the state goes back to its last ``commit()`` and training goes on with the ranks left.
    ``func`` must not be a collective itself (new ranks sync the state before calling it)."""
    return run_fn(func, reset)
