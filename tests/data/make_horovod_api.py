"""Writes horovod_0.28.1_api.json: the public names of Horovod's framework modules, read from Horovod's source (never
imported: Horovod needs its compiled extension).

    git clone https://github.com/horovod/horovod && \\
        python3 tests/data/make_horovod_api.py horovod v0.28.1 > tests/data/horovod_0.28.1_api.json

A module's public names are what its ``__init__.py`` binds at module level (in ``if``/``try`` blocks too: torch's
imports sit under ``if _MPI_LIB_AVAILABLE``) and does not start with ``_``, except what only serves the module's own
code: modules bound by ``import x`` (``tf``, ``os``), names from outside Horovod (``packaging.version``) and Horovod's
build helpers (``horovod.common.util``). ``common`` is the framework-independent part (``horovod/common``: the
methods and reduce ops of ``HorovodBasics``, process sets, exceptions) that some framework module exports; Horovod
has no numpy or JAX module, so that is what hora.numpy and hora.jax are held to.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

MODULES = {
    "horovod.torch": "horovod/torch/__init__.py",
    "horovod.tensorflow": "horovod/tensorflow/__init__.py",
    "horovod.tensorflow.keras": "horovod/tensorflow/keras/__init__.py",
    "horovod.keras": "horovod/keras/__init__.py",
    "horovod.mxnet": "horovod/mxnet/__init__.py",
}
COMMON = ["horovod/common/basics.py", "horovod/common/process_sets.py", "horovod/common/exceptions.py"]


def _show(repo: str, rev: str, path: str) -> ast.Module:
    text = subprocess.run(["git", "-C", repo, "show", f"{rev}:{path}"], capture_output=True, text=True, check=True)
    return ast.parse(text.stdout)


def _statements(body: list[ast.stmt]):
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _statements(block)


def _own(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] == "horovod" and module != "horovod.common.util"


def public_names(tree: ast.Module) -> list[str]:
    names = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom) and _own(node.module):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return sorted(n for n in names if not n.startswith("_"))


def common_names(repo: str, rev: str) -> set[str]:
    """HorovodBasics' public methods and its ``self.X = ...`` reduce ops; the other files' module-level names."""
    names: set[str] = set()
    for path in COMMON:
        tree = _show(repo, rev, path)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "HorovodBasics":
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        names.add(item.attr)
            elif not path.endswith("basics.py"):
                names |= set(public_names(ast.Module(body=[node], type_ignores=[])))
    return {n for n in names if not n.startswith("_")}


def main(repo: str, rev: str) -> None:
    rev_parse = ["git", "-C", repo, "rev-parse", f"{rev}^{{commit}}"]
    commit = subprocess.run(rev_parse, capture_output=True, text=True, check=True).stdout.strip()
    modules = {name: {"file": path, "names": public_names(_show(repo, rev, path))} for name, path in MODULES.items()}
    exported = {n for m in modules.values() for n in m["names"]}
    out = {
        "source": {"repository": "https://github.com/horovod/horovod", "tag": rev, "commit": commit},
        "made_by": "tests/data/make_horovod_api.py (its docstring says which names count)",
        "common": sorted(common_names(repo, rev) & exported),
        "modules": modules,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
