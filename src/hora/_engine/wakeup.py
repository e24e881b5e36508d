"""How user threads wake the engine thread: a non-blocking pipe, written at most once per wake-up (each write can
cost the writer a context switch) and drained before the next cycle."""

from __future__ import annotations

import os
import select

__all__ = ["WakePipe"]


class WakePipe:
    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        self._pending = False
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def wake(self) -> None:
        if self._pending:  # already woken and not yet up: one write is enough
            return
        self._pending = True
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed

    def wait(self, timeout: float) -> bool:
        """Sleep until woken or ``timeout`` seconds pass; True when woken."""
        return bool(select.select([self._r], [], [], timeout)[0])

    def drain(self) -> None:
        """Forget the wake-ups so far (before the cycle that serves them): a later one writes again."""
        self._pending = False
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
