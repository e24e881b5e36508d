"""hora run inside a Slurm allocation, started for real: hosts and np taken from the allocation, refused nesting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from hora.errors import ConfigError, HostError
from hora.runner import run_command


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORA_", "SLURM_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


PRINT_ENV = ("import os; print('ENV', os.environ['HORA_RANK'], os.environ['HORA_SIZE'], os.environ['HORA_LOCAL_SIZE'], "
             "os.environ.get('SLURM_JOB_ID'), os.environ.get('SLURM_PROCID'), os.environ.get('SLURM_STEP_ID'), "
             "os.environ.get('OMPI_COMM_WORLD_RANK'))")


def test_run_command_takes_hosts_and_np_from_a_single_node_allocation():
    """A batch script's environment on this machine: -np defaults to the allocation's slots, ranks run here, and
    the batch step's per-process variables do not reach the workers (the allocation's do)."""
    env = _env(SLURM_JOB_ID="77", SLURM_JOB_NODELIST=socket.gethostname(), SLURM_TASKS_PER_NODE="3",
               SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NTASKS="3")
    result = run_command([sys.executable, "-c", PRINT_ENV], env=env, capture=True, timeout=60)
    assert result.exit_code == 0, result.lines
    lines = sorted(line for r in result.lines.values() for line in r["stdout"])
    assert lines == [f"ENV {r} 3 3 77 None None None" for r in range(3)]


def test_run_command_np_above_the_allocation():
    env = _env(SLURM_JOB_NODELIST=socket.gethostname(), SLURM_TASKS_PER_NODE="2")
    with pytest.raises(ConfigError, match=r"-np 3 is more than the 2 slots .*hosts from the Slurm allocation SLURM_JOB_NODELIST="):
        run_command([sys.executable, "-c", "pass"], np=3, env=env)


def test_run_command_multi_node_allocation_goes_to_the_ssh_launcher():
    """The allocation's other nodes are remote hosts: the SSH preflight checks them and names the one it can't use."""
    env = _env(SLURM_JOB_NODELIST=f"{socket.gethostname()},other-node-x.invalid", SLURM_TASKS_PER_NODE="2(x2)")
    with pytest.raises(HostError, match=r"host other-node-x\.invalid: the name does not resolve"):
        run_command([sys.executable, "-c", "pass"], env=env, start_timeout=10)


def test_explicit_hosts_beat_the_allocation():
    env = _env(SLURM_JOB_NODELIST="other-node-x", SLURM_TASKS_PER_NODE="8")
    result = run_command([sys.executable, "-c", PRINT_ENV], hosts="localhost:2", env=env, capture=True, timeout=60)
    assert result.exit_code == 0, result.lines
    assert sorted(line.split()[2] for r in result.lines.values() for line in r["stdout"]) == ["2", "2"]


def test_cli_inside_mpirun_variables_is_refused():
    env = _env(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4")
    proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, "-c", "pass"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "hora run: hora run is running as rank 2 of 4 under Open MPI's mpirun" in proc.stderr, proc.stderr


def test_cli_without_np_outside_an_allocation():
    proc = subprocess.run([sys.executable, "-m", "hora", "run", sys.executable, "-c", "pass"], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give the number of processes: -np N" in proc.stderr, proc.stderr
