"""Every shell and Python example in the docs runs (issue 13, item 14): the docs tell the truth only if what they
show works as shown.

An example is a fenced block tagged ``python``, ``bash`` or ``sh``, or an untagged block whose every line is a
command (``hora ...``, ``python ...``, ``mpirun ...``). The line before its fence may say how to run it:

- ``<!-- example: hora run -np 2 -->`` runs a Python example on two ranks;
- ``<!-- example: skip: REASON -->`` does not run it, and must say why (needs several hosts, runs for minutes, is
  a fragment of a longer script whose whole is tested elsewhere, ...).

Examples run from the repository root with a private job home. ``pip install`` lines are left out: the test
environment has every extra installed already (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from support import paths

ROOT = paths.DOCS.parent
COMMANDS = ("hora", "python", "mpirun", "torchrun", "srun", "salloc", "sbatch", "export", "bash", "pip")
MARKER = re.compile(r"<!-- example: (.*?) -->")


@dataclass(frozen=True)
class Example:
    where: str  # docs/<file>.md:LINE
    lang: str  # "python" or "bash"
    code: str
    how: str  # what the marker said, "" when there is none


def _examples() -> list[Example]:
    out = []
    for path in [*sorted(paths.DOCS.glob("*.md")), ROOT / "README.md"]:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.match(r"^```(\w*)\s*$", lines[i])
            if not fence:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = lines[i + 1 : end]
            tag = fence.group(1)
            commands = [ln for ln in body if ln.strip()]
            untagged_commands = not tag and commands and all(ln.split()[0] in COMMANDS for ln in commands)
            if tag in ("python", "bash", "sh") or untagged_commands:
                marker = MARKER.search(lines[i - 1]) if i else None
                out.append(
                    Example(
                        f"{path.relative_to(ROOT)}:{i + 1}",
                        "python" if tag == "python" else "bash",
                        "\n".join(body) + "\n",
                        marker.group(1).strip() if marker else "",
                    )
                )
            i = end + 1
    return out


EXAMPLES = _examples()


def test_the_docs_have_examples_and_every_skip_says_why():
    assert len(EXAMPLES) >= 10
    for ex in EXAMPLES:
        if ex.how.startswith("skip"):
            assert len(ex.how.removeprefix("skip").strip(" :")) > 15, f"{ex.where}: a skipped example must say why"
        else:
            assert ex.how in ("", "hora run -np 2"), f"{ex.where}: unknown example marker {ex.how!r}"


@pytest.mark.parametrize("ex", [e for e in EXAMPLES if not e.how.startswith("skip")], ids=lambda e: e.where)
def test_example_runs(ex, tmp_path):
    env = {**os.environ, "HORA_JOB_HOME": str(tmp_path / "jobs"), "MPLBACKEND": "Agg"}
    if ex.lang == "python":
        script = tmp_path / "example.py"
        script.write_text(ex.code)
        cmd = [sys.executable, str(script)]
        if ex.how:
            cmd = [sys.executable, "-m", "hora", *ex.how.split()[1:], sys.executable, str(script)]
    else:
        code = "\n".join(ln for ln in ex.code.splitlines() if not ln.startswith("pip install"))
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    # Python examples run in a scratch directory that links the repository's examples/, so the files they write
    # (checkpoints, logs) do not land in the checkout; shell examples run from the root, as the docs show them.
    cwd = ROOT
    if ex.lang == "python":
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        (cwd / "examples").symlink_to(ROOT / "examples")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{ex.where} failed ({proc.returncode}):\n{ex.code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_the_core_installs_from_a_copy_of_the_checkout_into_a_fresh_venv(tmp_path):
    # A new user's first step (README: pip install ... -e '.[...]' in the checkout, then hora run), in a fresh
    # virtual environment. Without an index, so it needs no network: the core's dependencies (numpy, ml_dtypes) come
    # from this environment (--system-site-packages); the extras' lines are checked in tests/unit/test_install_lines.py.
    checkout = tmp_path / "hora"
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", "-c", "constraints.txt",
         "-e", "."],
        cwd=checkout, capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import hora, hora.numpy as hvd; hvd.init(); print(hora.__file__, hvd.allreduce(1.0, op=hvd.Sum))"
    run = subprocess.run([str(venv / "bin" / "hora"), "run", "-np", "2", str(python), "-c", code],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    where = checkout / "src" / "hora" / "__init__.py"
    assert sorted(run.stdout.splitlines()) == [f"[{r}]<stdout>: {where} 2.0" for r in (0, 1)], run.stdout
