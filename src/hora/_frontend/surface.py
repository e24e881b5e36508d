"""The names every adapter shares, defined once (Horovod's framework-independent part, ``horovod/common``): each of
``hora.numpy``, ``hora.torch``, ``hora.tensorflow``, ``hora.keras`` / ``hora.tensorflow.keras``, ``hora.jax`` and
``hora.mxnet`` re-exports exactly these objects (``from hora._frontend.surface import *``) and adds only its
framework's own names: collectives on its tensors, its optimizer, its compression, its callbacks.

The shared names: lifecycle (``init(comm=, process_sets=)``, ``shutdown``, ``is_initialized``), topology (``rank``,
``size``, ``max_size``, ``local_*``, ``cross_*``, ``is_homogeneous``), build queries (``*_built``, ``*_enabled``,
``mpi_threads_supported``), the timeline (``start_timeline``, ``stop_timeline``), the reduce ops (``Average`` ...
``Product``), process sets (``ProcessSet``, ``global_process_set``, ``add_process_set``, ``remove_process_set``) and
``HorovodInternalError``.
``tests/unit/test_public_api.py`` checks that every adapter has these names, as these very objects.
"""

from __future__ import annotations

from hora._frontend.build import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hora._frontend.control import start_timeline, stop_timeline
from hora._frontend.core import Adasum, Average, Max, Min, Product, Sum
from hora._frontend.lifecycle import init
from hora._frontend.process_set import ProcessSet, global_process_set
from hora._frontend.registration import add_process_set, remove_process_set
from hora._runtime.context import (
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    max_size,
    rank,
    shutdown,
    size,
)
from hora.errors import HorovodInternalError

__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "max_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
