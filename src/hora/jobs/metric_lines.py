"""Matching a job's output lines against its metric definitions and storing the values in the job store: one parser
for both places a line is seen, each rank's wrapper on this machine (:mod:`hora.jobs._entry`) and, for a job on
remote hosts, the supervisor reading the lines streamed home (:mod:`hora.jobs.remote_hosts`).

A remote host cannot reach the job store either for its system metrics: its first rank's wrapper samples the host
and echoes each batch as one line of its own, ``[algo-K system] [[time, name, value], ...]``
(:func:`system_metrics_line`). The script's lines reach hora run only through the wrapper, tagged
``[algo-K rank R]``, so a script cannot write such a line; the supervisor still keeps only the sampler's names and
finite numbers (:func:`parse_system_metrics_line`).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence

from hora.errors import HoraError
from hora.jobs.records import stderr_line
from hora.jobs.spec import MetricDefinition
from hora.jobs.store import JobStore
from hora.runner.system_metrics import METRIC_NAMES, Sample

__all__ = [
    "FLUSH_SECONDS", "MAX_METRIC_VALUES", "MAX_SYSTEM_SAMPLES", "MetricParser", "parse_system_metrics_line",
    "system_metrics_line",
]  # fmt: skip

FLUSH_SECONDS = 1.0
#: Metric values one rank may store for its job (each row is about 75 bytes in jobs.db): a script that prints a
#: matching line per batch for days would otherwise grow the index without bound (2 M rows took 151 MB).
MAX_METRIC_VALUES = 100_000
#: Samples one system-metrics line may carry (a batch is a few seconds of a host's samples, a dozen per reading).
MAX_SYSTEM_SAMPLES = 10_000
_SYSTEM = re.compile(r"^\[(algo-\d+) system\] (.*)$", re.S)


class MetricParser:
    """The metric values in the lines of a job's ranks, stored in batches (at most :data:`MAX_METRIC_VALUES` per
    rank); ``home`` None or empty: none are stored."""

    def __init__(self, definitions: Sequence[MetricDefinition], home: str | None, job: str) -> None:
        self.metrics = [(m.name, re.compile(m.regex)) for m in definitions]
        self.store = JobStore(home) if self.metrics and home else None
        self.job = job
        self.pending: list[tuple[str, float, float, str, int, int]] = []
        self.stored: dict[int, int] = {}  # rank -> metric values kept so far
        self.last_flush = time.monotonic()

    def feed(self, text: str, host: str, rank: int, attempt: int, now: float, tag: str) -> None:
        if self.store is None:
            return
        for name, regex in self.metrics:
            m = regex.search(text)
            if m is None:
                continue
            try:
                value = float(m.group(1) if regex.groups else m.group(0))
            except (ValueError, IndexError, TypeError):
                continue
            stored = self.stored[rank] = self.stored.get(rank, 0) + 1
            if stored > MAX_METRIC_VALUES:
                if stored == MAX_METRIC_VALUES + 1:
                    stderr_line(f"{tag} hora job: this rank has stored {MAX_METRIC_VALUES} metric values, the most "
                                "one rank keeps; later ones are in the logs only")
                continue
            self.pending.append((name, value, now, host, rank, attempt))
        self.flush_if_due(tag)

    def flush_if_due(self, tag: str = "") -> None:
        """Store what is pending when the last store is :data:`FLUSH_SECONDS` old (also while no line comes)."""
        if self.pending and time.monotonic() - self.last_flush >= FLUSH_SECONDS:
            self.flush(tag)

    def flush(self, tag: str = "") -> None:
        self.last_flush = time.monotonic()
        if self.pending and self.store is not None:
            rows, self.pending = self.pending, []
            try:
                self.store.add_metrics(self.job, rows)
            except HoraError as exc:  # a full disk: these values are lost, the script goes on
                stderr_line(f"{tag} hora job: {len(rows)} metric value(s) lost: {exc}")


def system_metrics_line(host: str, batch: Sequence[Sample]) -> str:
    """The line a remote host's wrapper echoes for a batch of its system metrics."""
    return f"[{host} system] " + json.dumps([[t, name, value] for t, name, value in batch], separators=(",", ":"))


def parse_system_metrics_line(text: str) -> tuple[str, list[Sample]] | None:
    """(host, samples) of a :func:`system_metrics_line`; None for any other line. Rows that are not a sampler's
    name with finite numbers are dropped (a damaged line gives no samples, never an error)."""
    m = _SYSTEM.match(text)
    if m is None:
        return None
    try:
        rows = json.loads(m.group(2))
    except ValueError:
        return m.group(1), []
    samples: list[Sample] = []
    for row in rows[:MAX_SYSTEM_SAMPLES] if isinstance(rows, list) else ():
        if isinstance(row, list) and len(row) == 3 and row[1] in METRIC_NAMES and _finite(row[0]) and _finite(row[2]):
            samples.append((float(row[0]), row[1], float(row[2])))
    return m.group(1), samples


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
