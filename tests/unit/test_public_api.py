"""The public names, pinned, and what ``import hora`` must not do (checked in fresh interpreters)."""

from __future__ import annotations

import json
import subprocess
import sys

import hora
import hora.numpy as hvd
from support import paths

NUMPY_API = [
    "Adasum",
    "Average",
    "GroupHandle",
    "Handle",
    "HorovodInternalError",
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
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
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
    "max_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
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
    assert sorted(hvd.__all__) == NUMPY_API
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


def test_the_cluster_engines_public_names_are_pinned():
    """hora.ray and hora.spark import without Ray or PySpark (they are imported when used)."""
    import hora.ray
    import hora.spark

    assert hora.ray.__all__ == [
        "ElasticRayExecutor", "ElasticRaySettings", "RayExecutor", "RayHostDiscovery", "RaySettings", "WorkerState"
    ]
    assert all(hasattr(hora.ray, n) for n in hora.ray.__all__)
    assert hora.spark.__all__ == ["run", "run_elastic"]
    assert all(hasattr(hora.spark, n) for n in hora.spark.__all__)


# Horovod 0.28.1's public names per framework module, read from its source by tests/data/make_horovod_api.py
HOROVOD = json.loads((paths.TESTS / "data" / "horovod_0.28.1_api.json").read_text())
#: hora's adapter -> the Horovod module whose names it must have. Horovod has no numpy or JAX module: those are held
#: to its framework-independent part (horovod/common), the names every hora adapter shares.
COUNTERPART = {
    "hora.numpy": "common",
    "hora.torch": "horovod.torch",
    "hora.tensorflow": "horovod.tensorflow",
    "hora.keras": "horovod.keras",
    "hora.tensorflow.keras": "horovod.tensorflow.keras",
    "hora.jax": "common",
    "hora.mxnet": "horovod.mxnet",
}
_TF_HELPER = "a helper horovod/tensorflow/__init__.py imports for its own optimizer code, not an API for scripts"
#: The deliberate gaps, each with its reason.
GAPS = {
    ("hora.tensorflow", "LocalGradientAggregationHelper"): _TF_HELPER,
    ("hora.tensorflow", "check_num_rank_power_of_2"): _TF_HELPER,
    ("hora.tensorflow", "handle_average_backwards_compatibility"): _TF_HELPER,
    ("hora.tensorflow", "refs_to_vars"): _TF_HELPER,
    ("hora.tensorflow", "vars_to_refs"): _TF_HELPER,
}
#: Each adapter's own names (beyond hora._frontend.surface's), pinned.
OWN_NAMES = {
    "hora.numpy": [
        "GroupHandle", "Handle", "allgather", "allgather_async", "allgather_object", "allreduce",
        "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
        "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object", "elastic",
        "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
        "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
        "grouped_reducescatter_async", "join", "poll", "reducescatter", "reducescatter_async",
        "synchronize",
    ],
    "hora.torch": [
        "Compression", "DistributedOptimizer", "SyncBatchNorm", "allgather", "allgather_async",
        "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
        "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
        "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "elastic", "grouped_allgather",
        "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
        "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll",
        "reducescatter", "reducescatter_async", "sparse_allreduce_async", "synchronize",
    ],
    "hora.tensorflow": [
        "BroadcastGlobalVariablesHook", "Compression", "DistributedGradientTape", "DistributedOptimizer",
        "PartialDistributedGradientTape", "PipeModeDataset", "SyncBatchNormalization", "allgather",
        "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_",
        "broadcast_global_variables", "broadcast_object", "broadcast_object_fn", "broadcast_variables", "elastic",
        "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join", "local_rank_op",
        "local_size_op", "process_set_included_op", "rank_op", "reducescatter", "shard", "size_op", "util",
    ],
    "hora.keras": [
        "Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allgather_object",
        "allreduce", "broadcast", "broadcast_global_variables", "broadcast_object", "callbacks", "elastic",
        "load_model", "reducescatter",
    ],
    "hora.tensorflow.keras": [
        "Compression", "DistributedOptimizer", "allgather", "allgather_object", "allreduce", "broadcast",
        "broadcast_global_variables", "broadcast_object", "callbacks", "elastic", "load_model", "reducescatter",
    ],
    "hora.jax": [
        "Compression", "DistributedOptimizer", "allgather", "allgather_object", "allreduce", "alltoall",
        "barrier", "broadcast", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "elastic",
        "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join", "reducescatter",
    ],
    "hora.mxnet": [
        "Compression", "DistributedOptimizer", "DistributedTrainer", "allgather", "allgather_object",
        "allreduce", "allreduce_", "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_object",
        "broadcast_parameters", "elastic", "grouped_allgather", "grouped_allreduce", "grouped_allreduce_",
        "grouped_reducescatter", "join", "reducescatter",
    ],
}
HOROVOD_KERAS_CALLBACKS = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
_ADAPTER_REPORT = """
import importlib, importlib.util, json, sys
from hora._frontend import surface
needs = {"hora.torch": "torch", "hora.tensorflow": "tensorflow", "hora.keras": "keras",
         "hora.tensorflow.keras": "tensorflow", "hora.jax": "jax", "hora.mxnet": "mxnet"}
out = {}
for name in json.loads(sys.argv[1]):
    if needs.get(name) and importlib.util.find_spec(needs[name]) is None:
        continue
    m = importlib.import_module(name)
    out[name] = {
        "all": list(m.__all__),
        "has": sorted(n for n in json.loads(sys.argv[2])[name] if hasattr(m, n)),
        "missing_from_all": sorted(n for n in m.__all__ if not hasattr(m, n)),
        "not_shared": sorted(n for n in surface.__all__ if getattr(m, n, None) is not getattr(surface, n)),
        "callbacks": sorted(c for c in json.loads(sys.argv[3]) if hasattr(getattr(m, "callbacks", None), c)),
        "ops": [m.Average, m.Sum, m.Adasum, m.Min, m.Max, m.Product],
        "eager": m._executing_eagerly() if hasattr(m, "_executing_eagerly") else None,
    }
print(json.dumps(out))
"""


def _horovod_names(adapter: str) -> list[str]:
    counterpart = COUNTERPART[adapter]
    return HOROVOD["common"] if counterpart == "common" else HOROVOD["modules"][counterpart]["names"]


def _adapter_reports(adapters: list[str]) -> dict:
    """Every adapter imported in one fresh interpreter (the frameworks are slow to import, and importing them here
    would slow the other tests' import checks); adapters whose framework is not installed are left out."""
    wanted = {a: _horovod_names(a) for a in adapters}
    args = [json.dumps(adapters), json.dumps(wanted), json.dumps(HOROVOD_KERAS_CALLBACKS)]
    proc = subprocess.run([sys.executable, "-c", _ADAPTER_REPORT, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_horovod_name_list_is_horovods_0_28_1():
    assert HOROVOD["source"]["tag"] == "v0.28.1"
    assert set(HOROVOD["modules"]) == {c for c in COUNTERPART.values() if c != "common"}
    for module in HOROVOD["modules"].values():
        assert module["names"] == sorted(set(module["names"]))
    # the framework-independent part: what the framework modules take from horovod/common
    assert {"init", "rank", "ProcessSet", "Average", "start_timeline", "nccl_built"} <= set(HOROVOD["common"])
    assert set(HOROVOD["common"]) <= {n for m in HOROVOD["modules"].values() for n in m["names"]}


def test_every_gap_is_a_real_horovod_name_with_a_reason():
    for (adapter, name), reason in GAPS.items():
        assert name in _horovod_names(adapter), (adapter, name)
        assert len(reason) > 20


#: Shared names Horovod's code lacks: ``max_size`` is documented (in Horovod's elastic guide) but never
#: defined there.
SURFACE_ADDITIONS = ["max_size"]


def test_the_shared_surface_is_horovods_framework_independent_part():
    from hora._frontend import surface

    assert sorted(surface.__all__) == sorted(HOROVOD["common"] + SURFACE_ADDITIONS)


def test_every_adapter_has_horovods_names_and_the_shared_objects():
    """For each adapter whose framework is installed: every name of its Horovod counterpart (or a listed gap), the
    shared names as hora._frontend.surface's very objects, its own names pinned, Horovod's reduce op values."""
    from hora._frontend import surface

    adapters = [a for a in COUNTERPART if a != "hora.mxnet"]  # MXNet: .venv-mxnet (test_mxnet_api.py)
    reports = _adapter_reports(adapters)
    assert "hora.numpy" in reports
    for adapter, got in reports.items():
        missing = sorted(set(_horovod_names(adapter)) - set(got["has"]) - {n for a, n in GAPS if a == adapter})
        assert missing == [], adapter
        assert [n for a, n in GAPS if a == adapter and n in got["has"]] == [], f"{adapter}: a gap was filled"
        assert got["missing_from_all"] == [] and got["not_shared"] == [], adapter
        assert len(got["all"]) == len(set(got["all"])), adapter
        assert sorted(set(got["all"]) - set(surface.__all__)) == OWN_NAMES[adapter], adapter
        assert set(surface.__all__) <= set(got["all"]), adapter
        assert got["ops"] == [0, 1, 2, 3, 4, 5], adapter
        assert got["eager"] is (True if adapter == "hora.tensorflow" else None), adapter  # Horovod scripts call it
        if "keras" in adapter:
            assert got["callbacks"] == HOROVOD_KERAS_CALLBACKS, adapter


def test_jax_imports_optax_only_when_distributed_optimizer_is_asked_for():
    import importlib.util

    import pytest

    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    assert _fresh("import sys, hora.jax; print('optax' in sys.modules)") == "False"
