"""hora for MXNet, with Horovod's API: ``import hora.mxnet as hvd`` where a script had ``import horovod.mxnet``.

Collectives on NDArrays (:mod:`hora.mxnet.mpi_ops`), ``DistributedOptimizer`` and ``DistributedTrainer``
(:mod:`hora.mxnet.optimizer`), ``broadcast_parameters`` and the object collectives (:mod:`hora.mxnet.functions`)
and ``Compression``. Differences from Horovod: docs/mxnet.md.
"""

from hora import elastic  # hvd.elastic: run, State, ObjectState (Horovod's horovod.common.elastic)
from hora._frontend import surface
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)
from hora.mxnet.compression import Compression
from hora.mxnet.functions import allgather_object, broadcast_object, broadcast_parameters
from hora.mxnet.mpi_ops import (
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    join,
    reducescatter,
)
from hora.mxnet.optimizer import DistributedOptimizer, DistributedTrainer

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "DistributedTrainer",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_parameters",
    "elastic",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_reducescatter",
    "join",
    "reducescatter",
]
__all__ += surface.__all__
