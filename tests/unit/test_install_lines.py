"""Every ``pip install`` line of README.md and docs/ works as written for a new user in a fresh clone (issue 25):
hora is installed from the checkout, not from a package index (``pip install 'hora[x]'`` fails with "No matching
distribution found"), every extra it names exists, and extras go with ``-c constraints.txt`` (the torch, Ray and
Spark pins). The TensorFlow extra pulls one TensorFlow, the CPU build.

A real install from a copy of the checkout into a fresh virtual environment is in
tests/multiprocess/test_docs_examples.py.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import sys
from dataclasses import dataclass

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from support import paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = paths.REPO
PIP = re.compile(r"(?:^|[\s`(])((?:[\w./-]*/)?pip3?) install ([^`#&|;\n]*)")
#: pip options that take a value (the value is not a requirement).
VALUED = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-e",
    "--editable",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-t",
    "--target",
}


@dataclass(frozen=True)
class InstallLine:
    where: str  # README.md:LINE
    words: tuple[str, ...]  # what follows "pip install", split as the shell would


def install_lines() -> list[InstallLine]:
    out = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for n, line in enumerate(md.read_text().splitlines(), 1):
            for m in PIP.finditer(line):
                out.append(InstallLine(f"{md.relative_to(REPO)}:{n}", tuple(shlex.split(m.group(2)))))
    return out


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def problems(line: InstallLine, extras: dict[str, list[str]]) -> list[str]:
    """What is wrong with one install line, as sentences; [] when it works from a fresh clone."""
    out = []
    words = list(line.words)
    options: dict[str, str] = {}
    targets = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in VALUED:
            options[w] = words[i + 1] if i + 1 < len(words) else ""
            if w in ("-e", "--editable"):
                targets.append(options[w])
            i += 2
            continue
        if not w.startswith("-"):
            targets.append(w)
        i += 1
    for flag in ("-c", "--constraint", "-r", "--requirement"):
        if flag in options and not (REPO / options[flag]).is_file():
            out.append(f"{flag} {options[flag]}: no such file in the checkout")
    for target in targets:
        local = re.fullmatch(r"\.(?:\[([\w,-]*)\])?", target)
        if local:
            named = [e for e in (local.group(1) or "").split(",") if e]
            out += [f"{target}: pyproject.toml has no extra {e!r}" for e in named if e not in extras]
            if named and "-c" not in options and "--constraint" not in options:
                out.append(
                    f"{target}: extras go with -c constraints.txt (its pins keep torch on the CPU build)"
                )
        elif canonicalize_name(Requirement(target).name) == "hora":
            fix = target.replace("hora", ".", 1)
            out.append(
                f"{target}: hora is not on a package index; install the checkout: pip install -c "
                f"constraints.txt -e '{fix}'"
            )
    return out


LINES = install_lines()


def test_the_docs_have_install_lines():
    assert len(LINES) >= 10
    assert any(line.where.startswith("README.md") for line in LINES)


@pytest.mark.parametrize("line", LINES, ids=lambda line: line.where)
def test_an_install_line_works_from_the_checkout(line):
    assert problems(line, _extras()) == [], f"{line.where}: pip install {shlex.join(line.words)}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "pip install 'hora[jax]'",
            "hora[jax]: hora is not on a package index; install the checkout: "
            "pip install -c constraints.txt -e '.[jax]'",
        ),
        ("pip install -c constraints.txt -e '.[nope]'", ".[nope]: pyproject.toml has no extra 'nope'"),
        ("pip install -e '.[jax]'", ".[jax]: extras go with -c constraints.txt"),
        ("pip install -c nowhere.txt -e .", "-c nowhere.txt: no such file in the checkout"),
    ],
)
def test_the_check_refuses_what_fails_for_a_new_user(text, expected):
    m = PIP.search(text)
    assert m
    found = problems(InstallLine("x", tuple(shlex.split(m.group(2)))), {"jax": []})
    assert len(found) == 1 and found[0].startswith(expected), found


def _requires(name: str) -> list[Requirement]:
    """What the installed distribution ``name`` requires (without its own extras); [] when not installed."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def test_an_extra_with_a_cpu_build_pulls_no_other_build():
    # tf_keras 2.21 requires `tensorflow` (the CUDA build), which pip installs beside `tensorflow-cpu` into the same
    # directory: a 572 MB download, and CUDA errors from every rank at start. Walk what each extra pulls (as far as
    # it is installed here) and refuse `X` wherever the extra asks for `X-cpu`.
    for extra, requirements in _extras().items():
        names = {canonicalize_name(Requirement(r).name) for r in requirements if not r.startswith("hora[")}
        cpu = {n.removesuffix("-cpu") for n in names if n.endswith("-cpu")}
        seen, todo = set(), list(names)
        while todo:
            name = todo.pop()
            for req in _requires(name):
                dep = canonicalize_name(req.name)
                assert dep not in cpu, f"extra {extra!r}: {name} requires {req}, the other build of {dep}-cpu"
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)


def test_no_message_in_the_sources_says_to_install_hora_from_an_index():
    # the errors for a missing extra (PyYAML, boto3, Ray, PySpark, scikit-learn) are a new user's first contact too
    index = re.compile(r"pip install\s+['\"]?hora\b")
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in sorted(paths.SRC.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if index.search(line)
    ]
    assert not found, f"say pip install -c constraints.txt -e '.[extra]' in hora's checkout instead: {found}"
