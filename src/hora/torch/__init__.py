"""hora for PyTorch, with Horovod's API: ``import hora.torch as hvd`` where a script had ``import horovod.torch``.

The names every adapter shares (lifecycle, topology, build queries, timeline, reduce ops, process sets,
``HorovodInternalError``: :mod:`hora._frontend.surface`), collectives on torch tensors (:mod:`hora.torch.mpi_ops`),
``DistributedOptimizer`` (:mod:`hora.torch.distributed_optimizer`), ``broadcast_parameters`` /
``broadcast_optimizer_state`` (:mod:`hora.torch.functions`) and ``Compression``.
"""

from hora._frontend import surface
from hora._frontend.surface import *  # noqa: F403  (the names every adapter shares: surface.__all__)
from hora.torch.compression import Compression
from hora.torch.distributed_optimizer import DistributedOptimizer
from hora.torch.functions import broadcast_optimizer_state, broadcast_parameters
from hora.torch.mpi_ops import (
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
    sparse_allreduce_async,
    synchronize,
)
from hora.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "SyncBatchNorm",
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
    "broadcast_optimizer_state",
    "broadcast_parameters",
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
    "sparse_allreduce_async",
    "synchronize",
]
__all__ += surface.__all__

from hora.torch import elastic  # noqa: E402  (hvd.elastic.run, TorchState, ElasticSampler; it uses the names above)
