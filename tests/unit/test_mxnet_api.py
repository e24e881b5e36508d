"""hora.mxnet's public names, pinned: Horovod's MXNet API (horovod/mxnet/__init__.py, 0.28.1: the list in
tests/data/horovod_0.28.1_api.json) and the names every hora adapter shares (hora._frontend.surface). Read from the
source, so the main environment (numpy 2, no MXNet) checks it too; .venv-mxnet imports it in tests/multiprocess/mxnet.
"""

from __future__ import annotations

import ast
import json

from hora._frontend import surface
from support import paths

#: hora.mxnet's own names (beyond the shared surface).
MXNET_OWN = [
    "Compression", "DistributedOptimizer", "DistributedTrainer", "allgather", "allgather_object", "allreduce",
    "allreduce_", "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_parameters",
    "elastic", "grouped_allgather", "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter", "join", "reducescatter",
]


def _module(path) -> tuple[list[str], bool, bool, set[str]]:
    """(__all__'s literal, whether ``__all__ += surface.__all__`` follows, whether the surface is star-imported,
    the names the module binds itself)."""
    tree = ast.parse(path.read_text())
    exported: list[str] = []
    extended = starred = False
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            exported = ast.literal_eval(node.value)
        elif isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "__all__":
            extended = ast.unparse(node.value) == "surface.__all__"
        elif isinstance(node, ast.ImportFrom):
            starred |= node.module == "hora._frontend.surface" and [a.name for a in node.names] == ["*"]
            bound |= {a.asname or a.name for a in node.names if a.name != "*"}
        elif isinstance(node, (ast.Assign, ast.FunctionDef, ast.ClassDef)):
            targets = node.targets if isinstance(node, ast.Assign) else [ast.Name(node.name)]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
    return exported, extended, starred, bound


def test_mxnet_all_is_pinned_and_shares_the_surface():
    exported, extended, starred, bound = _module(paths.SRC / "hora" / "mxnet" / "__init__.py")
    assert sorted(MXNET_OWN) == MXNET_OWN
    assert sorted(exported) == MXNET_OWN
    assert extended and starred  # the shared names are the surface's own objects
    assert set(exported) <= bound
    assert bound & set(surface.__all__) == set()  # and none is rebound here


def test_mxnet_has_horovods_names():
    horovod = json.loads((paths.TESTS / "data" / "horovod_0.28.1_api.json").read_text())
    names = horovod["modules"]["horovod.mxnet"]["names"]
    assert sorted(set(names) - set(MXNET_OWN) - set(surface.__all__)) == []
