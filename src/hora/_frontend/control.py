"""Barrier, join and the timeline switches."""

from __future__ import annotations

import os
import threading

from hora._engine.handle import Entry
from hora._engine.messages import Kind, Request
from hora._frontend.process_set import ProcessSet, global_process_set, group_of
from hora._runtime.context import current

__all__ = ["BARRIER_NAME", "barrier", "join", "start_timeline", "stop_timeline"]

BARRIER_NAME = "hora.barrier"
_BARRIER_LOCK = threading.Lock()


def barrier(process_set: ProcessSet | None = global_process_set) -> None:
    """Block until every rank (of ``process_set``) has called barrier()."""
    group = group_of(process_set)
    # One name for every barrier, so that after the first one it is answered from the response cache: agreed in
    # the shared-memory exchange, which releases all ranks together (a coordinator round releases rank 0 first).
    # Threads of one rank take turns: the n-th barrier of each rank pairs with the n-th of the others.
    with _BARRIER_LOCK:
        done = group.engine.express(BARRIER_NAME, None, None)  # the caller's thread runs it (hora._engine.express)
        if done is True:
            return
        if done is not False:
            done.handle.wait()
            return
        entry = Entry(Request(Kind.BARRIER, BARRIER_NAME))
        group.engine.enqueue([entry], wake=False)  # this thread waits, and runs the engine while it does
        entry.handle.wait()


def join() -> int:
    """Signal that this rank has no more data. Until every rank has joined, this rank contributes zeros to the
    allreduces the others still run. Returns the rank that joined last."""
    entry = Entry(Request(Kind.JOIN, "join"))
    current().engine.enqueue([entry], wake=False)
    return int(entry.handle.wait())


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline of every collective to ``file_path`` (rank 0 writes it). Replaces a
    timeline that is already being written. Same as setting HORA_TIMELINE (HOROVOD_TIMELINE) before init()."""
    current().engine.start_timeline(os.path.abspath(file_path), mark_cycles)


def stop_timeline() -> None:
    """Stop writing the timeline and close its file (which stays valid JSON)."""
    current().engine.stop_timeline()
