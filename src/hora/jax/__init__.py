"""hora for JAX, with Horovod's names: ``import hora.jax as hvd`` (Horovod itself never supported JAX).

Every collective works eagerly (numpy views of the arrays, no copy in) and inside ``jax.jit`` / ``jax.grad`` /
``lax.scan`` (one ordered host callback per call or grouped call), with Horovod's gradients
(:mod:`hora.jax.bridge` says how). ``DistributedOptimizer`` wraps an optax ``GradientTransformation`` and is
imported on first use (it needs optax). Differences from what a Horovod or JAX user may expect: docs/jax.md.
"""

from __future__ import annotations

from typing import Any

from hora._frontend import (
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hora._frontend.horovod_compat import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hora.errors import HoraError
from hora.jax.compression import Compression
from hora.jax.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hora.jax.movement import (
    allgather,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    join,
)
from hora.jax.reductions import (
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)

HorovodInternalError = HoraError
"""What a failed eager collective raises (inside a trace, JAX reports it as ``jax.errors.JaxRuntimeError``)."""

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]


def __getattr__(name: str) -> Any:
    if name in ("DistributedOptimizer", "DistributedOptimizerState"):
        from hora.jax import optimizer

        return getattr(optimizer, name)
    raise AttributeError(f"module 'hora.jax' has no attribute {name!r}")
