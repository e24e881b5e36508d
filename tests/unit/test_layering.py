"""The architecture rule (docs/architecture.md), read from the code's own imports: packages import only from lower
layers, no private name crosses a package boundary, only hora.config reads the environment, no module and no line is
long."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

from support import paths

SRC = paths.SRC

#: Lowest first; a package may import from its own layer's packages and from lower layers.
LAYERS = [
    ["hora.errors"],
    ["hora.config", "hora._wire", "hora._dtypes", "hora._proc", "hora._orphans"],
    ["hora._transport", "hora.data"],
    ["hora._engine"],
    ["hora._runtime"],
    ["hora"],
    ["hora._frontend", "hora.ps", "hora._strategy", "hora.elastic"],
    ["hora.numpy", "hora.torch", "hora.tensorflow", "hora.jax", "hora.mxnet"],
    ["hora.keras", "hora.tensorflow.keras"],
    ["hora.runner"],
    ["hora.jobs", "hora.ray", "hora.spark"],
    ["hora.dashboard"],
    ["hora.cli", "hora.__main__"],
]
MAX_LINES = 500
#: No line longer than this (ruff formats to this length too; a longer line is a squeeze or a string to split).
MAX_LINE_LENGTH = 120
#: Subpackages that are packages of their own in a higher layer (a façade over a package that uses their parent).
NESTED = ["hora.tensorflow.keras"]


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "hora").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def package(module: str) -> str:
    """``hora.jobs.lifecycle`` -> ``hora.jobs``; a top-level module is its own package (``hora.cli``)."""
    parts = module.split(".")
    for nested in NESTED:
        if module == nested or module.startswith(nested + "."):
            return nested
    return "hora" if len(parts) == 1 else ".".join(parts[:2])


def _imports(module: str, path: Path):
    """(line, imported module, imported name or None) for every import of hora, at any depth of the module."""
    tree = ast.parse(path.read_text())
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hora":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield (node.lineno, full, None) if full in MODULES else (node.lineno, target, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hora":
                    yield node.lineno, alias.name, None


def _edges():
    for module, path in MODULES.items():
        for line, target, name in _imports(module, path):
            if package(target) != package(module):
                yield f"{path.relative_to(SRC)}:{line}", module, target, name


def test_every_package_has_a_layer():
    assert sorted({package(m) for m in MODULES} - {p for layer in LAYERS for p in layer}) == []


def test_packages_import_only_from_lower_layers():
    layer = {p: i for i, ps in enumerate(LAYERS) for p in ps}
    upward = [
        f"{where}: {package(m)} imports {package(t)}"
        for where, m, t, _ in _edges()
        if layer[package(t)] > layer[package(m)]
    ]
    assert upward == []


def test_no_cycle_between_packages():
    graph = collections.defaultdict(set)
    for _, m, t, _ in _edges():
        graph[package(m)].add(package(t))
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in seen and (cycle := visit(nxt, [*path, node])):
                return cycle
        seen[node] = 2
        return None

    for start in sorted(graph):
        if start not in seen:
            assert visit(start, []) is None


def test_no_private_name_is_imported_from_another_package():
    private = []
    for where, _, target, name in _edges():
        below_top = target.split(".")[2:]  # hora._engine is hora-internal; hora.runner._x is runner's own
        if any(p.startswith("_") for p in below_top) or (name and name.startswith("_") and not name.startswith("__")):
            private.append(f"{where}: {target}{'.' + name if name else ''}")
    assert private == []


def _environment_readers() -> dict[str, list[str]]:
    """package -> where it touches os.environ / os.getenv."""
    readers = collections.defaultdict(list)
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("environ", "environb", "getenv", "putenv")
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                readers[package(module)].append(f"{path.relative_to(SRC)}:{node.lineno}: os.{node.attr}")
    return readers


#: The framework adapters, each a whole directory: a nested package (hora.tensorflow.keras) counts as its parent's.
ADAPTERS = ["hora.numpy", "hora.torch", "hora.tensorflow", "hora.keras", "hora.jax", "hora.mxnet"]


def _adapter(module: str) -> str | None:
    return next((a for a in ADAPTERS if module == a or module.startswith(a + ".")), None)


def _import_time(tree: ast.Module) -> set[int]:
    """The line numbers of the imports a module runs when it is imported: at module level (in ``if``/``try`` blocks
    too, not under ``if TYPE_CHECKING``), not inside a function."""
    lines: set[int] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines.add(node.lineno)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(block)

    visit(tree.body)
    return lines


def _adapter_edges() -> set[tuple[str, str, bool]]:
    """(adapter, adapter it imports, whether at import time) between different adapter directories."""
    edges = set()
    for module, path in MODULES.items():
        source = _adapter(module)
        if source is None:
            continue
        eager = _import_time(ast.parse(path.read_text()))
        for line, target, _ in _imports(module, path):
            dest = _adapter(target)
            if dest is not None and dest != source:
                edges.add((source, dest, line in eager))
    return edges


def test_no_import_cycle_between_adapter_packages():
    """Importing one adapter never imports another that imports it back: between the adapters' directories (the
    nested façade hora.tensorflow.keras counted in hora.tensorflow) the imports that run at import time form no
    cycle. hora.keras reaches the TensorFlow, torch and JAX adapters only inside the functions that run on that
    Keras backend (a torch-backend user never imports TensorFlow), which is what keeps it so."""
    eager = {(a, b) for a, b, at_import in _adapter_edges() if at_import}
    assert ("hora.tensorflow", "hora.keras") in eager  # the façade: so a top-level import back would be a cycle
    graph = collections.defaultdict(set)
    for a, b in eager:
        graph[a].add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    assert sorted(a for a in ADAPTERS if reaches(a, a, {a})) == []
    lazy_only = {(a, b) for a, b, at_import in _adapter_edges() if not at_import} - eager
    assert ("hora.keras", "hora.tensorflow") in lazy_only


def test_only_the_config_package_reads_the_environment():
    readers = _environment_readers()
    assert readers.pop("hora.config"), "hora.config is where the environment is read"
    assert dict(readers) == {}


def test_no_module_is_longer_than_the_limit():
    long = {str(p.relative_to(SRC)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_line_is_longer_than_the_limit():
    long = [
        f"{p.relative_to(SRC)}:{i}"
        for p in MODULES.values()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if len(line) > MAX_LINE_LENGTH
    ]
    assert long == []


def test_the_rule_catches_what_it_should():
    """The checks above are not vacuous: the import graph they read has the edges the architecture describes."""
    edges = {(package(m), package(t)) for _, m, t, _ in _edges()}
    assert ("hora._engine", "hora._transport") in edges
    assert ("hora._runtime", "hora._engine") in edges
    assert ("hora.torch", "hora._frontend") in edges
    assert ("hora.jobs", "hora.runner") in edges
