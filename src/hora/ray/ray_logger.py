"""Horovod's ``horovod.ray.ray_logger``: :func:`log` in a worker sends a value to the driver, where every callback
given to ``run``/``execute`` of :class:`~hora.ray.RayExecutor` or ``run`` of :class:`~hora.ray.ElasticRayExecutor`
is called with it, in the order the values were logged.

The values travel through a Ray queue (an actor on the driver's node) that the executor hands to its workers for
the length of one call (:class:`Callbacks`); outside such a call :func:`log` warns once and drops the value, as
Horovod's does.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Callbacks", "configure", "log"]

_log = logging.getLogger(__name__)
_queue: Any = None
_warned = False
#: How often the driver looks for logged values.
POLL_SECONDS = 0.1


def configure(queue: Any) -> None:
    """Where :func:`log` sends values in this worker (None: nowhere)."""
    global _queue
    _queue = queue


def log(info_dict: Any) -> None:
    """Send ``info_dict`` (anything picklable) to the driver's callbacks."""
    global _warned
    if _queue is not None:
        _queue.put(info_dict)
    elif not _warned:
        warnings.warn("`ray_logger.log` called but logging is not configured.", stacklevel=2)
        _warned = True


class Callbacks:
    """The driver's side of one call with ``callbacks``: a queue for the workers and a thread calling every callback
    with every value logged. ``with Callbacks(callbacks) as queue:`` — ``queue`` is None without callbacks. Values
    logged before the call returns are all delivered before the ``with`` ends. A callback that raises is reported
    on the ``hora.ray`` logger and the others still get the value."""

    def __init__(self, callbacks: Sequence[Callable[[Any], Any]] | None) -> None:
        self.callbacks = list(callbacks or [])
        self.queue: Any = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._deliver, name="hora-ray-callbacks", daemon=True)

    def __enter__(self) -> Any:
        if self.callbacks:
            from ray.util.queue import Queue

            self.queue = Queue(actor_options={"num_cpus": 0})
            self._thread.start()
        return self.queue

    def __exit__(self, *_: object) -> None:
        if self.queue is None:
            return
        self._done.set()
        self._thread.join(60.0)
        self.queue.shutdown()

    def _deliver(self) -> None:
        while True:
            done = self._done.is_set()  # read before draining: what was logged before the call ended is delivered
            while not self.queue.empty():
                value = self.queue.get_nowait()
                for callback in self.callbacks:
                    try:
                        callback(value)
                    except Exception:
                        _log.exception("hora.ray: a callback raised on the value %r", value)
            if done:
                return
            self._done.wait(POLL_SECONDS)
