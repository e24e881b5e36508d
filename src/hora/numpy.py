"""hora for numpy arrays, with Horovod's names: ``import hora.numpy as hvd``.

The implementation lives in :mod:`hora._frontend`, which the other framework adapters share; this module is its
public face for numpy arrays (``tests/unit/test_public_api.py`` pins the names): the names every adapter shares
(:mod:`hora._frontend.surface`) and the collectives on numpy arrays. Every collective here also takes
``process_set=`` (a registered :class:`ProcessSet`, default every rank; ``root_rank`` stays a global rank, as in
Horovod).
"""

from __future__ import annotations

from hora import elastic  # hvd.elastic: run, State, ObjectState (Horovod's horovod.common.elastic)
from hora._engine.handle import Handle
from hora._frontend import (
    GroupHandle,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    surface,
    synchronize,
)
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)

__all__ = [
    "GroupHandle",
    "Handle",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "elastic",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "synchronize",
]
__all__ += surface.__all__
