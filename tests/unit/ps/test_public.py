"""hora.ps's public names, pinned; importing it pulls in no framework."""

from __future__ import annotations

import subprocess
import sys

import hora.ps

PS_API = [
    "RULES", "Client", "FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "ParameterServer",
    "Partitioner", "ShardKey", "balance", "connect", "parse_consistency", "place", "round_robin", "shard_offsets",
    "UpdateRule", "Sum", "SGD", "Momentum", "Adagrad", "Adam",
]  # fmt: skip


def test_ps_all_is_pinned():
    assert sorted(hora.ps.__all__) == sorted(PS_API)
    assert all(hasattr(hora.ps, n) for n in PS_API)


def test_import_hora_ps_imports_no_framework():
    code = "import sys, hora.ps; print(sorted(m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
