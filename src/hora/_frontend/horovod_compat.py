"""Horovod's lifecycle and build queries as every adapter without a framework-specific twist answers them:
``init(comm=None, process_sets=None)`` and ``mpi_built()`` ... ``rocm_built()``.

Answered honestly: hora's data planes are its own (shared memory and TCP), not MPI, Gloo, NCCL, DDL, oneCCL or a
CUDA/ROCm build; it runs under mpirun without using MPI.
"""

from __future__ import annotations

from typing import Any

from hora._frontend.registration import add_process_set
from hora._runtime.context import init as _init
from hora.errors import UnsupportedError

__all__ = [
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rocm_built",
]


def init(comm: Any = None, process_sets: Any = None, **settings: Any) -> None:
    """Start hora in this process (idempotent; ``init()`` after ``shutdown()`` starts afresh). ``settings``
    override :class:`hora.Config` fields (e.g. ``transport="tcp"``)."""
    if comm is not None:
        raise UnsupportedError(
            "init(comm=...) is not supported: hora takes its ranks from the launcher (hora run, mpirun, srun, "
            "torchrun); call init() without comm"
        )
    _init(**settings)
    if process_sets == "dynamic":  # Horovod's switch for add/remove after init: always on in hora
        return
    for ps in process_sets or []:  # static process sets: registered in order, as every rank lists them
        add_process_set(ps)


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    raise ValueError("Horovod MPI is not enabled; hora does not use MPI (it runs under mpirun without it).")


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
