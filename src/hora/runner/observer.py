"""Watching a run from outside the launcher: the calls ``hora run --record`` turns into a job-store entry.

The launcher calls :meth:`RunObserver.started` once the ranks are placed, :meth:`RunObserver.line` for every whole
line a rank (or parameter server) writes, from the output pump's thread, and :meth:`RunObserver.ended` once with
the exit code and the root-cause report (empty when every rank succeeded). An observer must not raise: what it
cannot record it says once on its own and drops; the run goes on either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["RunObserver"]


class RunObserver(Protocol):
    def started(self, ranks: Sequence[tuple[int, str]]) -> None:
        """The ranks and the host each runs on, in rank order."""

    def line(self, label: str, stream: str, text: str) -> None:
        """A whole line (its newline removed) of rank ``label`` (``"3"``; a parameter server's ``"ps0"``)."""

    def ended(self, exit_code: int, report: str) -> None:
        """The run is over: its exit code and the root-cause report (empty when it succeeded)."""
