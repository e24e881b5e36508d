"""Horovod's collective API on numpy arrays, shared by every framework adapter (``hora.numpy`` is its public face).

Every function goes through the engine: ``allreduce(x)`` is ``synchronize(allreduce_async(x))``. Modules:
``core`` (ops, argument checks, submitting, waiting), ``process_set`` (ProcessSet, which group a call runs in),
``reductions`` (allreduce, reducescatter), ``movement`` (allgather, broadcast, alltoall), ``control`` (barrier,
join, timeline), ``objects`` (object collectives), ``registration`` (adding and removing process sets),
``lifecycle`` (``init(comm=, process_sets=)``), ``build`` (the ``*_built()`` queries) and ``surface`` (the names
every adapter shares, re-exported here). Adapters call the ``start_*`` functions to have results written into their
framework's memory.
"""

from hora._frontend import surface
from hora._frontend.control import barrier, join
from hora._frontend.core import GroupHandle, poll, synchronize
from hora._frontend.movement import (
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    start_broadcast,
)
from hora._frontend.objects import allgather_object, broadcast_object
from hora._frontend.reductions import (
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
    start_allreduce,
    start_grouped_allreduce,
)
from hora._frontend.surface import *  # noqa: F403  (the shared names: surface.__all__)

__all__ = [
    "GroupHandle",
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
    "start_allreduce",
    "start_broadcast",
    "start_grouped_allreduce",
    "synchronize",
]
__all__ += surface.__all__
