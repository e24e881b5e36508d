"""The same script under mpirun, torchrun-style and Slurm-style variables gets correct ranks without hora run."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPORT = str(Path(__file__).parent / "scripts" / "report.py")
FOREIGN = ("HORA_", "HOROVOD_", "OMPI_", "PMIX_", "SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def parse(out: str) -> dict[int, dict[str, str]]:
    results = {}
    for m in re.finditer(r"RESULT rank=(\d+) size=(\d+) local=(\d+)/(\d+) cross=(\d+)/(\d+) sum=(\d+)", out):
        results[int(m[1])] = dict(zip(["size", "local_rank", "local_size", "cross_rank", "cross_size", "sum"], m.groups()[1:]))
    return results


def expect(results: dict[int, dict[str, str]], n: int) -> None:
    assert sorted(results) == list(range(n)), results
    for r, got in results.items():
        assert got == {"size": str(n), "local_rank": str(r), "local_size": str(n), "cross_rank": "0",
                       "cross_size": "1", "sum": str(n * (n - 1) // 2)}, got


def spawn_by_hand(n: int, per_rank_env) -> str:
    procs = [subprocess.Popen([sys.executable, REPORT], env=clean_env(**per_rank_env(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(n)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0, stderr
            out.append(stdout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return "".join(out)


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_under_mpirun():
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    proc = subprocess.run(["mpirun", "--oversubscribe", "-np", "4", sys.executable, REPORT], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), 4)


def test_under_torchrun_variables():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_id = uuid.uuid4().hex

    def env(r: int) -> dict[str, str]:
        return {"RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id}

    expect(parse(spawn_by_hand(3, env)), 3)


def test_under_slurm_step_variables():
    job = str(uuid.uuid4().int % 10**6)

    def env(r: int) -> dict[str, str]:
        return {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_NODEID": "0",
                "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "2"}

    expect(parse(spawn_by_hand(2, env)), 2)


@pytest.mark.skipif(shutil.which("torchrun") is None and not shutil.which("python"), reason="no torchrun")
def test_under_real_torchrun():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", REPORT],
                          env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), 2)


def test_plain_python_is_a_single_rank():
    proc = subprocess.run([sys.executable, REPORT], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    expect(parse(proc.stdout), 1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ({"HORA_RANK": "4", "HORA_SIZE": "4"}, "HORA_RANK=4 and HORA_SIZE=4 are inconsistent"),
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x' is not a whole number"),
        ({"HORA_RANK": "0", "HORA_SIZE": "2"}, "nothing tells hora where the other ranks meet"),
    ],
)
def test_inconsistent_variables_outside_a_launcher_are_clear_errors(env, message):
    proc = subprocess.run([sys.executable, REPORT], env=clean_env(**env), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "ConfigError" in proc.stderr and message in proc.stderr, proc.stderr
