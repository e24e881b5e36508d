"""How many of a set of time intervals overlap at most (e.g. trials of a tuning job, from their start and end
times)."""

from __future__ import annotations


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of ``(start, end)`` intervals open at the same moment (an interval that ends when another
    starts does not overlap it)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most
