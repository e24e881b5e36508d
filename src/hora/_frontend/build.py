"""Horovod's build queries (``mpi_built()`` ... ``rocm_built()``), answered honestly for every adapter: hora's data
planes are its own (shared memory and TCP), not MPI, Gloo, NCCL, DDL, oneCCL or a CUDA/ROCm build; it runs under
mpirun without using MPI."""

from __future__ import annotations

__all__ = [
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rocm_built",
]


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
