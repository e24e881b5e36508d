"""Horovod's ``init(comm, process_sets)`` and its build queries (``mpi_built()`` ...), answered for hora: its data
planes are its own (shared memory and TCP), not MPI, Gloo, NCCL, DDL, oneCCL or a CUDA/ROCm build; it runs under
mpirun without using MPI. Framework adapters re-export these (hora.jax does; hora.torch and hora.tensorflow keep
their own copies, written before this module)."""

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
    override :class:`hora.Config` fields (e.g. ``transport="tcp"``); ``process_sets`` are registered in order
    (every rank lists the same ones), ``"dynamic"`` is accepted (adding and removing sets is always allowed)."""
    if comm is not None:
        raise UnsupportedError(
            "init(comm=...) is not supported: hora takes its ranks from the launcher (hora run, mpirun, srun, "
            "torchrun); call init() without comm"
        )
    _init(**settings)
    if process_sets == "dynamic":
        return
    for ps in process_sets or []:
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
