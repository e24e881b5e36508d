"""Handles: what an ``*_async`` call returns, completed by the engine thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hora._engine.messages import Request
from hora.errors import TimeoutError

__all__ = ["Entry", "Handle", "Pieces", "duplicate_name"]


class Handle:
    """The future result of one collective. ``wait()`` returns the result or raises the collective's error."""

    __slots__ = ("_done", "_driver", "_error", "_gate", "_result", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        # A plain lock held until the result is in: a tenth of a threading.Event's cost, which matters when a
        # training step submits hundreds of tensors.
        self._gate = threading.Lock()
        self._gate.acquire()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        # The engine's "run cycles until this handle is done" (set when enqueued): the waiting thread drives.
        self._driver: Callable[[Handle, float | None], None] | None = None

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done:
            left = timeout
            if self._driver is not None:
                start = time.monotonic()
                self._driver(self, timeout)
                if timeout is not None:
                    left = max(0.0, timeout - (time.monotonic() - start))
            if not self._gate.acquire(timeout=-1 if left is None else left):
                raise TimeoutError(f"'{self.name}' did not complete within {timeout:g}s")
            self._gate.release()  # let any other waiter through too
        if self._error is not None:
            raise self._error.with_traceback(None)  # the engine thread's frames would only confuse
        return self._result

    def settle(self, timeout: float) -> bool:
        """Sleep until the result is in or ``timeout`` passes, driving nothing; whether it is in."""
        if self._gate.acquire(timeout=timeout):
            self._gate.release()
            return True
        return self._done

    def _complete(self) -> None:
        self._done = True
        try:
            self._gate.release()
        except RuntimeError:  # completed twice at once (a failure racing a result): the first one stands
            pass

    def _set_result(self, value: Any) -> None:
        if not self._done:
            self._result = value
            self._complete()

    def _set_error(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._complete()

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done() else "pending"
        return f"<hora.Handle {self.name!r} {state}>"


@dataclass
class Pieces:
    """The tensors of a grouped allreduce submitted as one request: reduced as the virtual concatenation of
    ``srcs`` into ``dsts`` (flat views, same sizes), with no packing copy beyond the transport's own."""

    srcs: list[np.ndarray]
    dsts: list[np.ndarray]
    outs: list[np.ndarray]  # the results as the caller gets them (``dsts`` in their shapes)


@dataclass
class Entry:
    """A request of this rank together with its buffers. ``input`` is C-contiguous; ``output`` is preallocated
    for allreduce and broadcast (it may be ``input`` itself for in-place calls) and made at execution otherwise.
    A grouped allreduce sent as one request has ``pieces`` instead (and no ``input``/``output``)."""

    request: Request
    input: np.ndarray | None = None
    output: np.ndarray | None = None
    pieces: Pieces | None = None
    handle: Handle = field(init=False)
    queued_at: float = field(init=False, default=0.0)  # time.monotonic() when enqueued (stall inspection)

    def __post_init__(self) -> None:
        self.handle = Handle(self.request.name)


def duplicate_name(entries: list[Entry], pending: dict[str, Entry]) -> str | None:
    """A name of ``entries`` already pending, or given twice among them; None when all are new."""
    if len(entries) == 1:  # the common case (a gradient's hook): no lists, no set
        return entries[0].request.name if entries[0].request.name in pending else None
    names = [e.request.name for e in entries]
    taken = [n for n in names if n in pending]
    if taken or len(set(names)) < len(names):
        return taken[0] if taken else next(n for n in names if names.count(n) > 1)
    return None
