"""The job store's index is only an index: losing or damaging jobs.db never costs a job (issue 19, items 3-4)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

from hora.jobs import JobStore, parse_spec, start_job

SCRIPT = """
    import os, sys
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.txt"), "w") as f:
        f.write(sys.argv[-1])
"""


def _job(tmp_path: Path, name: str, version: str):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name,
                       "hyperparameters": {"version": version}})
    return start_job(spec, JobStore(tmp_path / "home"), wait=True, echo=False)


def _hora_job(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hora", "job", "--home", str(tmp_path / "home"), *args],
                          capture_output=True, text=True, timeout=120)


def _weights(record) -> bytes:
    with tarfile.open(record.artifacts["model"]) as tar:
        return tar.extractfile("weights.txt").read()  # type: ignore[union-attr]


def _remove_index(home: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'jobs.db'}{suffix}").unlink(missing_ok=True)


def test_a_lost_index_never_overwrites_a_job_and_is_rebuilt_from_the_job_directories(tmp_path):
    old = _job(tmp_path, "keep", "v1")
    assert old.status == "Completed" and _weights(old) == b"v1"
    _remove_index(tmp_path / "home")

    listed = _hora_job(tmp_path, "list")
    assert listed.returncode == 0 and "no entry in the job index" in listed.stderr and "reindex" in listed.stderr
    again = _hora_job(tmp_path, "run", "--job-name", "keep", str(_spec_file(tmp_path)))
    assert again.returncode == 2, again.stderr
    assert "already has a directory" in again.stderr and "hora job --home" in again.stderr and "reindex" in again.stderr
    assert "Traceback" not in again.stderr
    assert _weights(old) == b"v1"  # untouched
    described = _hora_job(tmp_path, "describe", "keep")
    assert described.returncode == 2 and "reindex" in described.stderr

    rebuilt = _hora_job(tmp_path, "reindex")
    assert rebuilt.returncode == 0 and "indexed 1 job(s)" in rebuilt.stdout and "keep" in rebuilt.stdout
    record = JobStore(tmp_path / "home").get("keep")
    assert (record.status, record.exit_code, record.artifacts) == ("Completed", 0, old.artifacts)
    assert record.spec["hyperparameters"] == {"version": "v1"}
    assert "rebuilt by `hora job reindex`" in _hora_job(tmp_path, "describe", "keep").stdout


def _spec_file(tmp_path: Path) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(f"entry_point: train.py\nsource_dir: {tmp_path / 'src'}\nhyperparameters: {{version: v2}}\n")
    return spec


def test_a_damaged_index_is_exit_2_with_a_hint_and_reindex_moves_it_aside(tmp_path):
    old = _job(tmp_path, "keep", "v1")
    db = tmp_path / "home" / "jobs.db"
    _remove_index(tmp_path / "home")
    db.write_bytes(b"SQLite format 3\0" + os.urandom(4096))  # garbled
    for args in (["list"], ["describe", "keep"], ["logs", "keep"], ["run", str(_spec_file(tmp_path))]):
        proc = _hora_job(tmp_path, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert f"the job index {db} is damaged" in proc.stderr and "reindex" in proc.stderr, proc.stderr
    rebuilt = _hora_job(tmp_path, "reindex")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "moved the damaged index aside to" in rebuilt.stdout and "indexed 1 job(s)" in rebuilt.stdout
    assert list((tmp_path / "home").glob("jobs.db.damaged-*"))
    assert JobStore(tmp_path / "home").get("keep").artifacts == old.artifacts
    listed = _hora_job(tmp_path, "list")
    assert listed.returncode == 0 and "keep" in listed.stdout and "Completed" in listed.stdout


def test_the_job_home_is_private(tmp_path):
    """Issue 19, item 9: the index and the job's files hold the spec's environment and hyperparameters."""
    record = _job(tmp_path, "private", "v1")
    home, job = tmp_path / "home", Path(record.job_dir)
    for d in (home, home / "jobs", job, job / "hora", job / "logs"):
        assert d.stat().st_mode & 0o777 == 0o700, d
    files = [home / "jobs.db", job / "hora" / "spec.json", job / "hora" / "plan.json", job / "hora" / "record.json",
             job / "hora" / "env-algo-1.json", job / "logs" / "job.log", job / "logs" / "algo-1.log",
             *(job / "hosts" / "algo-1").rglob("*.json")]
    assert len(files) > 9
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f


def test_records_with_wrong_fields_are_described_not_a_traceback(tmp_path):
    """Issue 19, item 5: valid JSON with the wrong fields in plan.json ended describe in KeyError: 'addresses'."""
    record = _job(tmp_path, "odd", "v1")
    hora_dir = Path(record.job_dir) / "hora"
    (hora_dir / "plan.json").write_text('{"hosts": ["algo-1"]}')
    (hora_dir / "attempt-1" / "result.json").write_text('{"returncodes": "zero"}')
    (hora_dir / "attempt-1" / "rank-0.json").write_text("[1, 2]")
    for args in (["describe", "odd"], ["list"], ["logs", "odd"]):
        proc = _hora_job(tmp_path, *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    out = _hora_job(tmp_path, "describe", "odd").stdout
    assert f"Network:           unknown: {hora_dir / 'plan.json'} is not a plan hora wrote (no field 'addresses')" in out
    assert "holds records hora did not write" in out
