"""Registering and removing process sets. Both are collectives of every rank (as in Horovod): all ranks call
``add_process_set`` with the same ranks, in the same order. A set is a group of its own among its members (its
own control connections, transport and engine thread, assembled by :func:`hora._runtime.group.assemble`), so a
collective on one set never waits for another set's; the members find each other through the global group's
collectives (:class:`_GlobalDirectory`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hora._frontend.control import barrier
from hora._frontend.objects import allgather_object
from hora._frontend.process_set import ProcessSet, global_process_set
from hora._runtime.context import Context, current
from hora._runtime.group import GroupSpec, assemble
from hora.errors import HoraError

__all__ = ["add_process_set", "add_process_sets", "remove_process_set"]


class _GlobalDirectory:
    """A set's directory: allgathers and barriers of the global group, which every rank joins (non-members too)."""

    def __init__(self, tag: str, members: list[int]) -> None:
        self._tag, self._members = tag, members

    def allgather(self, key: str, value: dict[str, Any] | None) -> list[dict[str, Any]]:
        everyone = allgather_object(value, name=f"{self._tag}.{key}", process_set=global_process_set)
        return [everyone[r] for r in self._members]

    def barrier(self, key: str) -> None:
        barrier(global_process_set)


def _check_ranks(ctx: Context, ranks: Sequence[int]) -> list[int]:
    members = sorted({int(r) for r in ranks})
    if not members or members[0] < 0 or members[-1] >= ctx.size:
        raise ValueError(f"a process set needs ranks in 0..{ctx.size - 1}, got {list(ranks)}")
    return members


def _add(ctx: Context, ranks: Sequence[int]) -> tuple[int, list[int]]:
    """Create a process set of ``ranks`` on every rank. Returns (id, ranks)."""
    members = _check_ranks(ctx, ranks)
    set_id = ctx.next_set_id
    tag = f"hora.process_set.{set_id}"
    everyone = allgather_object(members, name=f"{tag}.ranks", process_set=global_process_set)
    if any(other != members for other in everyone):
        groups: dict[str, list[int]] = {}
        for r, other in enumerate(everyone):
            groups.setdefault(str(other), []).append(r)
        got = "; ".join(
            f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))} passed {m}" for m, rs in groups.items()
        )
        raise ValueError(f"add_process_set must be called by every rank with the same ranks; got {got}")
    if members == list(range(ctx.size)) or members in ctx.set_ranks.values():
        raise ValueError(f"a process set of ranks {members} already exists; add_process_set takes a new set of ranks")
    ctx.next_set_id += 1
    ctx.set_ranks[set_id] = members
    spec = GroupSpec(
        ctx.config,
        tuple(members),
        f"{ctx.config.attempt}-{ctx.tag}-ps{set_id}",
        ctx.secret,
        ctx.job_id,
        ctx.launch.source,
        set_id=set_id,
        hierarchical=False,  # a set spanning hosts runs on the flat TCP ring among its members
    )
    group = assemble(
        spec,
        _GlobalDirectory(tag, members),
        members.index(ctx.rank) if ctx.rank in members else None,
        hostname=ctx.hostname,
        bind_addr=ctx.bind_addr,
        deadline=time.monotonic() + ctx.config.start_timeout,
    )
    if group is not None:
        ctx.sets[set_id] = group
    return set_id, members


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of ranks). Every rank must call this with the same ranks, in
    the same order as its other ``add_process_set`` calls; ranks outside the set take part in creating it too."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps!r} was already added")
    set_id, ranks = _add(current(), ps.ranks)
    ps.ranks, ps.process_set_id = ranks, set_id
    return ps


def add_process_sets(sets: list[ProcessSet]) -> None:
    """``init(process_sets=...)``: register ``sets`` in order, all of them or none. Every entry is checked before
    any is registered; a set whose ranks a registered set has is bound to it (Horovod's repeated ``init``); if a
    registration fails, the sets this call registered are removed again before the error is raised."""
    ctx = current()
    known = {tuple(ranks): set_id for set_id, ranks in ctx.set_ranks.items()}
    known[tuple(range(ctx.size))] = 0
    seen: set[tuple[int, ...]] = set()
    plan: list[tuple[ProcessSet, list[int], int | None]] = []
    for i, ps in enumerate(sets):
        members = _check_ranks(ctx, ps.ranks)
        if tuple(members) in seen or known.get(tuple(members)) == 0:
            what = "the global process set" if known.get(tuple(members)) == 0 else "an earlier entry"
            raise ValueError(
                f"init(process_sets=...): entry number {i} is a duplicate: {ps!r} has the ranks of {what}; every "
                "process set needs ranks of its own (none of the sets was registered)"
            )
        seen.add(tuple(members))
        plan.append((ps, members, known.get(tuple(members))))
    added: list[tuple[ProcessSet, int, list[int]]] = []
    try:
        for ps, members, set_id in plan:
            if set_id is None:
                set_id, members = _add(ctx, members)
                added.append((ps, set_id, members))
    except Exception as exc:
        try:
            for _, set_id, _ in reversed(added):
                _remove(ctx, set_id)
        except Exception as undo:
            raise HoraError(
                f"init(process_sets=...) failed ({exc}) and removing the sets it had registered failed too "
                f"({undo}); call shutdown() and init() again"
            ) from exc
        raise
    new = {id(ps): (set_id, members) for ps, set_id, members in added}
    for ps, members, set_id in plan:
        ps.process_set_id, ps.ranks = new.get(id(ps), (set_id, members))


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a process set added before (every rank calls this). Returns False if it was not registered."""
    if process_set.process_set_id == 0:
        raise ValueError("the global process set cannot be removed")
    set_id = process_set.process_set_id
    if set_id is None:
        return False
    removed = _remove(current(), set_id)
    process_set.process_set_id = None
    return removed


def _remove(ctx: Context, set_id: int) -> bool:
    everyone = allgather_object(set_id, name=f"hora.process_set.remove.{set_id}", process_set=global_process_set)
    if any(other != set_id for other in everyone):
        raise ValueError(f"remove_process_set must be called by every rank for the same set; got {everyone}")
    sub = ctx.sets.pop(set_id, None)
    if sub is not None:
        sub.engine.shutdown()
    return ctx.set_ranks.pop(set_id, None) is not None
