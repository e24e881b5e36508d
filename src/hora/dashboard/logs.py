"""A job's logs for the dashboard: the last lines at first, then what is appended, filtered by host and rank.

A job writes ``logs/job.log`` (the supervisor: status changes, staging, archiving) and ``logs/<host>.log`` (each
rank's lines, ``<UTC time> [algo-1 rank 0]<stdout> text``). A :class:`LogFollower` remembers how far it has read
each file, so a page gets every line once however long the job runs; only the tail of a large log is read at
first (:data:`TAIL_BYTES` per file), never the whole file.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["LogFollower", "log_sources"]

#: Bytes read from the end of each log file for the first view.
TAIL_BYTES = 256 * 1024
#: Bytes read from one file per follow step (a burst of output is shown over a few steps, not held in memory).
STEP_BYTES = 1024 * 1024
#: The supervisor's log, shown as the source "job".
JOB_SOURCE = "job"


def log_sources(job_dir: str | Path, hosts: list[str]) -> dict[str, Path]:
    """Source name -> log file: ``job`` for the supervisor's log, then each host."""
    logs = Path(job_dir) / "logs"
    return {JOB_SOURCE: logs / "job.log", **{h: logs / f"{h}.log" for h in hosts}}


class LogFollower:
    """Reads a job's log files from where it stopped; ``host`` (a source name) and ``rank`` filter the lines."""

    def __init__(self, sources: dict[str, Path], host: str | None = None, rank: int | None = None) -> None:
        if host is not None and host not in sources:
            raise KeyError(host)
        self._files = {name: path for name, path in sources.items() if host is None or name == host}
        self._rank = None if rank is None else re.compile(rf"^\S+ \[\S+ rank {int(rank)}\]")
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}

    def tail(self, lines: int) -> list[str]:
        """The last ``lines`` lines (after the filter), in time order; later calls of :meth:`new` go on from here."""
        out: list[str] = []
        for name, path in self._files.items():
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, 2)
                    start = max(0, size - TAIL_BYTES)
                    f.seek(start)
                    data = f.read(size - start)
            except FileNotFoundError:
                self._offsets[name] = 0
                continue
            if start > 0:  # the first line is cut: drop it
                data = data.split(b"\n", 1)[1] if b"\n" in data else b""
            self._offsets[name] = size
            out += self._complete(name, data)
        return self._ordered(out)[-lines:] if lines > 0 else []

    def new(self) -> list[str]:
        """The lines appended since the last call (after the filter), in time order."""
        out: list[str] = []
        for name, path in self._files.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(name, 0))
                    data = f.read(STEP_BYTES)
                    self._offsets[name] = f.tell()
            except FileNotFoundError:
                continue
            if data:
                out += self._complete(name, data)
        return self._ordered(out)

    def _complete(self, name: str, data: bytes) -> list[str]:
        *whole, self._partial[name] = (self._partial.get(name, b"") + data).split(b"\n")
        return [line.decode(errors="replace") for line in whole]

    def _ordered(self, lines: list[str]) -> list[str]:
        if self._rank is not None:
            lines = [line for line in lines if self._rank.match(line)]
        return sorted(lines, key=lambda line: line[:19])  # the UTC time to the second: each file keeps its order
