"""hora.mxnet's public names, pinned: Horovod's MXNet API (horovod/mxnet/__init__.py, 0.28.1) plus the names every
hora adapter has. Read from the source, so the main environment (numpy 2, no MXNet) checks it too."""

from __future__ import annotations

import ast

from support import paths

MXNET_API = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "DistributedTrainer", "Max", "Min", "ProcessSet",
    "Product", "Sum", "add_process_set", "allgather", "allgather_object", "allreduce", "allreduce_", "alltoall",
    "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_parameters", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather",
    "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter", "init", "is_homogeneous", "is_initialized",
    "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank",
    "reducescatter", "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline",
]  # fmt: skip


def _module_all(path) -> tuple[list[str], set[str]]:
    tree = ast.parse(path.read_text())
    exported: list[str] = []
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            exported = ast.literal_eval(node.value)
        elif isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names}
    return exported, imported


def test_mxnet_all_is_pinned_and_every_name_is_imported():
    exported, imported = _module_all(paths.SRC / "hora" / "mxnet" / "__init__.py")
    assert sorted(MXNET_API) == MXNET_API
    assert exported == MXNET_API
    assert set(exported) <= imported
