"""hora under a real single-node Slurm cluster (the ``slurm`` fixture: slurmctld + slurmd started here, see
tests/support/slurm_cluster.py): hora under ``srun``, and ``hora run`` inside an allocation taking its hosts and
slots from ``SLURM_JOB_NODELIST``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from support.report import REPORT, expect, parse
from support.slurm_cluster import MIN_CPUS as NTASKS


def test_srun_gives_each_task_its_rank(slurm: dict[str, str]) -> None:
    proc = subprocess.run(["srun", "-n", str(NTASKS), "--overcommit", "-t", "5", sys.executable, REPORT], env=slurm,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), NTASKS)


SHOW_ENV = (
    "import os; print('ENV', os.environ['HORA_RANK'], os.environ['SLURM_JOB_ID'], os.environ.get('SLURM_PROCID'),"
    " os.environ.get('SLURM_STEP_ID'))"
)


def test_hora_run_inside_salloc_uses_the_allocation(slurm: dict[str, str]) -> None:
    """salloc -n 4 hora run (no -np, no -H): 4 ranks from SLURM_JOB_NODELIST/SLURM_TASKS_PER_NODE, on this node."""
    hora_run = [sys.executable, "-m", "hora", "run"]
    proc = subprocess.run(["salloc", "-n", str(NTASKS), "--overcommit", "-t", "5", *hora_run, sys.executable, REPORT],
                          env=slurm, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), NTASKS)
    # The workers are in the allocation (SLURM_JOB_ID) but are not Slurm tasks (no step variables).
    proc = subprocess.run(["salloc", "-n", "2", "-t", "5", *hora_run, sys.executable, "-c", SHOW_ENV],
                          env=slurm, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = sorted(line.split("ENV ", 1)[1] for line in proc.stdout.splitlines() if "ENV " in line)
    assert len(rows) == 2 and [r.split()[0] for r in rows] == ["0", "1"], proc.stdout
    assert all(r.split()[1].isdigit() and r.split()[2:] == ["None", "None"] for r in rows), rows


def test_hora_run_inside_srun_is_refused(slurm: dict[str, str]) -> None:
    """srun -n 2 hora run ...: every task would start a job of its own."""
    proc = subprocess.run(["srun", "-n", "2", "-t", "5", sys.executable, "-m", "hora", "run", "-np", "2",
                           sys.executable, REPORT], env=slurm, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "hora run is running as rank" in proc.stderr and "of 2 under a Slurm job step (srun)" in proc.stderr, (
        proc.stderr
    )


def test_srun_inside_hora_run_wins_over_stale_hora_variables(slurm: dict[str, str]) -> None:
    """hora run -np 1 salloc ... srun -n 4: the tasks inherit the one hora worker's HORA_*; srun's ranks win."""
    inner = ["srun", "-n", str(NTASKS), "--overcommit", "-t", "5", sys.executable, REPORT]
    proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "1", "salloc", "-n", str(NTASKS),
                           "--overcommit", "-t", "5", *inner], env=slurm, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), NTASKS)


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_mpirun_inside_an_allocation_uses_open_mpis_ranks(slurm: dict[str, str]) -> None:
    """salloc -n 4 mpirun -np 4: the ranks see the allocation's SLURM_* and Open MPI's variables; mpirun's win."""
    env = {**slurm, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    proc = subprocess.run(["salloc", "-n", str(NTASKS), "--overcommit", "-t", "5", "mpirun", "--oversubscribe", "-np",
                           str(NTASKS), sys.executable, REPORT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), NTASKS)


def test_srun_step_smaller_than_its_allocation(slurm: dict[str, str]) -> None:
    """salloc -n 4 srun -n 2: the step's tasks (SLURM_STEP_TASKS_PER_NODE), not the allocation's, are the ranks."""
    proc = subprocess.run(["salloc", "-n", str(NTASKS), "--overcommit", "-t", "5", "srun", "-n", "2", sys.executable,
                           REPORT], env=slurm, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), 2)
