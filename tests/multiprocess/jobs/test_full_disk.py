"""A full disk under the job home (a real 2 MiB tmpfs) ends the job Failed with a reason that names the path, keeps
the job's story readable, and never leaves a truncated artifact (issue 19, item 2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hora.jobs import JobStore, parse_spec, start_job

# Each rank writes 1.5 MB of incompressible weights and exits 0: the script succeeds, the archive cannot fit.
BIG_MODEL = """
    import os
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"weights-{os.environ['HORA_RANK']}.bin"), "wb") as f:
        f.write(os.urandom(700_000))
    print("saved", flush=True)
"""
# The script fills the disk itself, then prints on.
FILLING = """
    import os
    try:
        with open(os.path.join(os.environ["SM_MODEL_DIR"], f"fill-{os.environ['HORA_RANK']}.bin"), "wb") as f:
            while True:
                f.write(os.urandom(65536))
                f.flush()
    except OSError as exc:
        print("the script saw:", exc, flush=True)
    for i in range(100):
        print("line", i, flush=True)
"""


@pytest.fixture
def small_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(home)], check=True)
    try:
        yield home
    finally:
        if subprocess.run(["umount", str(home)]).returncode != 0:
            subprocess.run(["umount", "-l", str(home)], check=True)


def _run(tmp_path: Path, home: Path, script: str, name: str):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(textwrap.dedent(script))
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name, "processes_per_host": 2,
                       "network": "loopback"})
    return start_job(spec, JobStore(home), wait=True, echo=False)


def _hora_job(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hora", "job", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=120)


def _fill(home: Path) -> None:
    with open(home / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_an_archive_that_does_not_fit_fails_the_job_saying_the_script_succeeded(tmp_path, small_home):
    record = _run(tmp_path, small_home, BIG_MODEL, "big")
    assert (record.status, record.exit_code) == ("Failed", 0)
    assert record.failure_reason.startswith("ClientError: the script succeeded (every rank exited 0), but archiving "
                                            "the artifacts failed: writing "), record.failure_reason
    assert str(small_home / "jobs" / "big") in record.failure_reason and "No space left on device" in record.failure_reason
    leftovers = [p for p in small_home.rglob("*") if p.name.endswith((".tar.gz", ".part"))]
    assert leftovers == [], "a partial archive was left behind"
    _fill(small_home)  # read-only commands on a full disk
    for args in (["list"], ["describe", "big"], ["logs", "big"]):
        proc = _hora_job(small_home, *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert "the script succeeded" in _hora_job(small_home, "describe", "big").stdout


def test_a_script_that_fills_the_disk_fails_the_job_with_the_full_path_named(tmp_path, small_home):
    record = _run(tmp_path, small_home, FILLING, "filling")
    assert record.status == "Failed"
    reason = record.failure_reason
    assert f"the file system of {small_home / 'jobs' / 'filling'} is full" in reason, reason
    assert "No space left on device" in reason and "Traceback" not in reason, reason
    assert [p for p in small_home.rglob("*") if p.name.endswith((".tar.gz", ".part"))] == []
    history = [t[3] for t in JobStore(small_home).transitions("filling")]
    assert history[-1].startswith("HostError") and any("Uploading" in t or "archiving" in t for t in history)
