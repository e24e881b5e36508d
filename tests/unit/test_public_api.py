"""The public names, pinned, and what ``import hora`` must not do (checked in fresh interpreters)."""

from __future__ import annotations

import json
import subprocess
import sys

import hora
import hora.numpy as hvd

NUMPY_API = [
    "Adasum",
    "Average",
    "GroupHandle",
    "Handle",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
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
    "cross_rank",
    "cross_size",
    "global_process_set",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]

HORA_API = ["Config", "__version__", "errors", "init", "is_initialized", "shutdown"]


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_numpy_all_is_pinned():
    assert sorted(NUMPY_API) == NUMPY_API
    assert hvd.__all__ == NUMPY_API
    assert len(set(hvd.__all__)) == len(hvd.__all__)


def test_numpy_all_names_exist():
    missing = [n for n in hvd.__all__ if not hasattr(hvd, n)]
    assert missing == []


def test_numpy_reduce_ops_have_horovods_values():
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_hora_all_is_pinned():
    assert sorted(hora.__all__) == HORA_API
    assert all(hasattr(hora, n) for n in hora.__all__)


def test_import_does_not_import_torch():
    out = _fresh("import hora, hora.numpy, sys; print('torch' in sys.modules)")
    assert out == "False"


def test_import_hora_imports_no_framework():
    code = (
        "import hora, sys; "
        "print(sorted(m for m in ('torch', 'tensorflow', 'jax', 'mxnet', 'keras') if m in sys.modules))"
    )
    assert _fresh(code) == "[]"


def test_import_starts_no_thread_and_sets_no_environment_variable():
    code = (
        "import json, os, threading\n"
        "env, threads = dict(os.environ), threading.enumerate()\n"
        "import hora, hora.numpy, hora.runner\n"
        "changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))\n"
        "print(json.dumps({'threads': [t.name for t in threading.enumerate() if t not in threads], 'env': changed}))\n"
    )
    assert json.loads(_fresh(code)) == {"threads": [], "env": []}


# horovod/torch/__init__.py's public names (0.28), which scripts written for Horovod use
HOROVOD_TORCH_NAMES = ["allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "alltoall", "alltoall_async", "broadcast", "broadcast_async", "broadcast_", "broadcast_async_", "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object", "SyncBatchNorm", "HorovodInternalError"]


def test_torch_has_horovods_names():
    import pytest

    hvd_torch = pytest.importorskip("hora.torch")
    missing = [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd_torch, n)]
    assert missing == []
    assert sorted(hvd_torch.__all__) == hvd_torch.__all__
    assert set(HOROVOD_TORCH_NAMES) <= set(hvd_torch.__all__)
    assert (hvd_torch.Average, hvd_torch.Sum, hvd_torch.Adasum, hvd_torch.Min, hvd_torch.Max) == (0, 1, 2, 3, 4)


def test_the_cluster_engines_public_names_are_pinned():
    """hora.ray and hora.spark import without Ray or PySpark (they are imported when used)."""
    import hora.ray
    import hora.spark

    assert hora.ray.__all__ == ["RayExecutor", "RaySettings", "WorkerState"]
    assert all(hasattr(hora.ray, n) for n in hora.ray.__all__)
    assert hora.spark.__all__ == ["run"]
    assert all(hasattr(hora.spark, n) for n in hora.spark.__all__)


# horovod/tensorflow/__init__.py's public names (0.28), which scripts written for Horovod use
HOROVOD_TENSORFLOW_NAMES = ["allgather", "allreduce", "grouped_allreduce", "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier", "size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op", "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object", "broadcast_global_variables", "BroadcastGlobalVariablesHook", "DistributedOptimizer", "DistributedGradientTape", "PartialDistributedGradientTape", "SyncBatchNormalization", "util"]


def test_tensorflow_has_horovods_names():
    """Checked in a fresh interpreter: importing TensorFlow here would slow every later test's import checks."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    code = (
        "import json, hora.tensorflow as hvd\n"
        f"names = {HOROVOD_TENSORFLOW_NAMES!r}\n"
        "print(json.dumps({'missing': [n for n in names if not hasattr(hvd, n)], 'sorted': sorted(hvd.__all__) == "
        "hvd.__all__, 'extra_ok': set(names) <= set(hvd.__all__), 'eager': hvd._executing_eagerly(), "
        "'ops': [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product]}))"
    )
    assert json.loads(_fresh(code).splitlines()[-1]) == {
        "missing": [], "sorted": True, "extra_ok": True, "eager": True, "ops": [0, 1, 2, 3, 4, 5],
    }  # fmt: skip


# horovod/tensorflow/keras/__init__.py's public names (0.28) that hora.keras and hora.tensorflow.keras provide
HOROVOD_KERAS_NAMES = ["init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "DistributedOptimizer", "broadcast_global_variables", "allreduce", "allgather", "broadcast", "reducescatter", "broadcast_object", "allgather_object", "load_model", "callbacks"]
HOROVOD_KERAS_CALLBACKS = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]


def test_keras_has_horovods_names():
    """hora.keras and hora.tensorflow.keras, in a fresh interpreter (TensorFlow is slow to import)."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("tensorflow or keras is not installed")
    code = (
        "import json, hora.keras as k, hora.tensorflow.keras as tk\n"
        f"names, cbs = {HOROVOD_KERAS_NAMES!r}, {HOROVOD_KERAS_CALLBACKS!r}\n"
        "print(json.dumps([[n for n in names if not hasattr(m, n)] + [c for c in cbs if not hasattr(m.callbacks, c)]"
        " + ([] if sorted(m.__all__) == m.__all__ and set(names) <= set(m.__all__) else ['__all__'])"
        " for m in (k, tk)]))"
    )
    assert json.loads(_fresh(code).splitlines()[-1]) == [[], []]


# hora.jax: horovod.torch's names that have a meaning for immutable JAX arrays (no in-place, no async variants,
# no SyncBatchNorm), pinned; checked in a fresh interpreter, without importing optax until DistributedOptimizer is
# asked for.
JAX_API = ["Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "init", "is_homogeneous", "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter", "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline"]


def test_jax_names_are_pinned():
    import importlib.util

    import pytest

    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("optax") is None:
        pytest.skip("jax or optax is not installed")
    code = (
        "import json, sys, hora.jax as hvd\n"
        "lazy = 'optax' not in sys.modules\n"
        "print(json.dumps({'all': hvd.__all__, 'lazy': lazy, 'has': all(hasattr(hvd, n) for n in hvd.__all__),"
        " 'ops': [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product]}))"
    )
    assert json.loads(_fresh(code).splitlines()[-1]) == {
        "all": JAX_API, "lazy": True, "has": True, "ops": [0, 1, 2, 3, 4, 5],
    }  # fmt: skip
