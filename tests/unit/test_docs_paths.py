"""Every path the docs and the sources name exists, and every example script is run by some test (issue 25): a
renamed module or a moved test leaves no pointer to nowhere behind, and no example rots unrun.

Paths that look like the repository's files are checked wherever they appear in README.md, docs/*.md, .ci/ and
the Python files of src/, tests/, examples/ and benchmarks/ (docstrings, comments and strings alike):

- rooted ones: ``src/...``, ``tests/...``, ``docs/...``, ``examples/...``, ``benchmarks/...``, ``.ci/...``;
- module paths under the package: ``hora/config/settings.py`` (that is ``src/hora/...``), and ``_runtime/group.py``
  or ``support/parts.py`` whose first directory is one of ``src/hora``'s or ``tests``'s (found below either);
- relative Markdown links, ``[x](ps.md#restarts)`` or ``[x](#restarts)``, with their anchor.

A path with a placeholder (``<name>``, ``*``, ``{a,b}``) is a pattern, not a path, and is not checked.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

from support import paths

REPO = paths.REPO
ROOTS = ("src", "tests", "docs", "examples", "benchmarks", ".ci")
ROOTED = re.compile(r"(?<![\w./-])((?:src|tests|docs|examples|benchmarks|\.ci)/[\w./*<>{}-]*)")
MODULE = re.compile(r"(?<![\w./<>-])((?:\w+/)+\w+\.py)\b")
LINK = re.compile(r"\]\(([\w./-]+\.md)?(?:#([\w-]+))?\)")
MARKER = re.compile(r"<!-- example: (.*?) -->")


def _tracked(*where: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *where], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [REPO / p for p in out.split() if (REPO / p).is_file()]


def _checked_files() -> list[Path]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *_tracked(".ci")]
    return docs + [p for p in _tracked("src", "tests", "examples", "benchmarks") if p.suffix == ".py"]


def _package_dirs() -> set[str]:
    """Names of the directories a module path may start from: hora's packages and the tests' folders."""
    names = {"hora"}
    for base in (paths.SRC / "hora", paths.TESTS):
        names |= {p.name for p in base.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    return names


def _module_exists(path: str) -> bool:
    if path.startswith("hora/"):
        return (paths.SRC / path).exists()
    bases = [paths.SRC / "hora", paths.TESTS, *(p for p in (paths.SRC / "hora").rglob("*") if p.is_dir())]
    return any((base / path).exists() for base in bases)


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


@functools.cache
def _anchors(md: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", md.read_text(), re.M)}


def dead_paths() -> list[str]:
    packages = _package_dirs()
    dead = []
    for f in _checked_files():
        where = f.relative_to(REPO)
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in ROOTED.finditer(line):
                path = m.group(1).rstrip(".,:;)`'\"")
                if not any(c in path for c in "*<>{}") and not (REPO / path).exists():
                    dead.append(f"{where}:{n}: {path}")
            for m in MODULE.finditer(line):
                path = m.group(1)
                if path.split("/")[0] in packages and not _module_exists(path):
                    dead.append(f"{where}:{n}: {path}")
            if f.suffix == ".md":
                for m in LINK.finditer(line):
                    if not m.group(1) and not m.group(2):
                        continue
                    target = (f.parent / m.group(1)).resolve() if m.group(1) else f
                    if not target.exists():
                        dead.append(f"{where}:{n}: link {m.group(1)}")
                    elif m.group(2) and m.group(2) not in _anchors(target):
                        dead.append(f"{where}:{n}: link {m.group(1) or ''}#{m.group(2)} (no such heading)")
    return dead


def test_every_path_named_in_the_docs_and_sources_exists():
    dead = dead_paths()
    assert not dead, "paths to nowhere (fix the path, or write a pattern as <name>):\n" + "\n".join(dead)


def test_the_path_check_finds_a_dead_path(tmp_path, monkeypatch):
    # the check itself can fail: a docstring naming a test that does not exist is reported
    fake = tmp_path / "tests" / "test_fake.py"
    fake.parent.mkdir()
    missing = ["/".join(("tests", "no_such_test.py")), "/".join(("hora", "no_such_module.py"))]  # not paths here
    fake.write_text(f'"""See {missing[0]} and {missing[1]}."""\n')
    monkeypatch.setattr(f"{__name__}._checked_files", lambda: [fake])
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert [d.split(": ", 1)[1] for d in dead_paths()] == missing


def _strings_in_tests() -> str:
    """Every string constant of the test sources that is not a docstring (a docstring may name an example without
    running it)."""
    out = []
    for f in _tracked("tests"):
        if f.suffix != ".py" or f.resolve() == Path(__file__).resolve():
            continue
        tree = ast.parse(f.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        out += [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
        ]
    return "\n".join(out)


def _doc_examples_that_run() -> str:
    """The fenced blocks of README.md and docs/*.md that tests/multiprocess/test_docs_examples.py runs (not marked
    ``skip``)."""
    out = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = md.read_text().splitlines()
        i = 0
        while i < len(lines):
            if re.match(r"^```\w*\s*$", lines[i]):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                marker = MARKER.search(lines[i - 1]) if i else None
                if not (marker and marker.group(1).strip().startswith("skip")):
                    out += lines[i + 1 : end]
                i = end + 1
            else:
                i += 1
    return "\n".join(out)


def test_every_example_script_is_run_by_a_test():
    ran = _strings_in_tests() + "\n" + _doc_examples_that_run()
    unrun = [p.name for p in sorted((REPO / "examples").glob("*.py")) if p.name not in ran]
    assert not unrun, f"examples no test runs (name them in a test, or run them in a docs example): {unrun}"
