"""The same script under mpirun, torchrun-style and Slurm-style variables gets correct ranks without hora run."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from support.report import REPORT, clean_env, expect, parse


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


# -- launchers inside launchers: the innermost one wins (docs/launchers.md) ----------------------------------------
HORA_RUN = [sys.executable, "-m", "hora", "run"]
MPIRUN = ["mpirun", "--oversubscribe"]
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")


def mpi_env() -> dict[str, str]:
    return clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                     OMPI_MCA_btl_vader_single_copy_mechanism="none")


@pytest.mark.mpi
@needs_mpirun
def test_hora_run_inside_mpirun_is_refused():
    proc = subprocess.run([*MPIRUN, "-np", "2", *HORA_RUN, "-np", "2", sys.executable, REPORT], env=mpi_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "hora run is running as rank" in proc.stderr and "of 2 under Open MPI's mpirun" in proc.stderr, proc.stderr
    assert "mpirun -np 2 python train.py" in proc.stderr
    assert "RESULT" not in proc.stdout


@pytest.mark.mpi
@needs_mpirun
def test_hora_run_inside_mpirun_of_one_process_runs_its_job():
    """mpirun -np 1 hora run -np 3: one job; the workers do not see mpirun's rank 0 of 1."""
    proc = subprocess.run([*MPIRUN, "-np", "1", *HORA_RUN, "-np", "3", sys.executable, REPORT], env=mpi_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), 3)


@pytest.mark.mpi
@needs_mpirun
def test_mpirun_inside_hora_run_wins_over_stale_hora_variables():
    """hora run -np 1 mpirun -np 4: every mpirun rank inherits the hora worker's HORA_* (rank 0 of 1, its
    rendezvous, secret and job id); Open MPI's ranks win and the outer job's rendezvous is not used."""
    proc = subprocess.run([*HORA_RUN, "-np", "1", *MPIRUN, "-np", "4", sys.executable, REPORT], env=mpi_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect(parse(proc.stdout), 4)


def test_slurm_step_with_stale_hora_run_settings():
    """srun inside hora run (by hand): HORA_* of an outer job whose rendezvous is gone must not be used."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # nothing listens here any more
    job = str(uuid.uuid4().int % 10**6)

    def env(r: int) -> dict[str, str]:
        return {"HORA_RANK": "0", "HORA_SIZE": "1", "HORA_LOCAL_RANK": "0", "HORA_LOCAL_SIZE": "1",
                "HORA_RENDEZVOUS_ADDR": "127.0.0.1", "HORA_RENDEZVOUS_PORT": str(dead_port),
                "HORA_SECRET": "ab" * 32, "HORA_JOB_ID": "outer", "HORA_HOSTNAME": "outer-host",
                "RANK": "0", "WORLD_SIZE": "1", "HORA_START_TIMEOUT": "20",
                "SLURM_PROCID": str(r), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(r), "SLURM_NODEID": "0",
                "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "3"}

    expect(parse(spawn_by_hand(3, env)), 3)


def test_slurm_step_with_contradicting_exported_rank_fails_clearly():
    env = clean_env(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_STEP_ID="0", SLURM_JOB_ID="5", RANK="0", WORLD_SIZE="2")
    proc = subprocess.run([sys.executable, REPORT], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "RANK=0 and WORLD_SIZE=2 contradict this Slurm job step's SLURM_PROCID=1" in proc.stderr, proc.stderr


# -- torchrun across "nodes" (faked on this machine with distinct host names) -------------------------------------
def _non_loopback_address() -> str | None:
    from hora._runtime.bootstrap import local_addresses

    addrs = local_addresses()
    return addrs[0] if addrs else None


def _torchrun_two_nodes(master: str) -> tuple[dict[int, dict[str, str]], dict[int, dict[str, str]]]:
    """2 nodes x 2 ranks, torchrun's multi-node variables; node g's ranks report host name node-g."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_id = uuid.uuid4().hex

    def env(r: int) -> dict[str, str]:
        node, local = divmod(r, 2)
        return {"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2", "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": "4",
                "ROLE_NAME": "default", "MASTER_ADDR": master, "MASTER_PORT": str(port),
                "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "HORA_HOSTNAME": f"node-{node}"}

    procs = [subprocess.Popen([sys.executable, str(Path(REPORT).parent / "report_addrs.py")], env=clean_env(**env(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(4)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=90)
            assert p.returncode == 0, stderr
            out.append(stdout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "".join(out)
    addrs = {int(m[1]): dict(zip(["host", "rendezvous", "bind", "transport"], m.groups()[1:]))
             for m in re.finditer(r"ADDRS rank=(\d+) host=(\S+) rendezvous=(\S+) bind=(\S+) transport=(\S+)", text)}
    return parse(text), addrs


def _expect_two_nodes(results: dict[int, dict[str, str]]) -> None:
    assert sorted(results) == [0, 1, 2, 3], results
    for r, got in results.items():
        node, local = divmod(r, 2)
        assert got == {"size": "4", "local_rank": str(local), "local_size": "2", "cross_rank": str(node),
                       "cross_size": "2", "sum": "6"}, (r, got)


@pytest.mark.parametrize("master", ["address", "hostname"])
def test_torchrun_multi_node_variables(master):
    """Rank 0 hosts the rendezvous on an address the other node can reach: MASTER_ADDR itself when it is a
    non-loopback address of this machine, and a routable address when MASTER_ADDR is this machine's name that
    resolves to loopback here (as Debian's 127.0.1.1 entry does) — never 127.0.0.1 for a multi-node job."""
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to act as another node's MASTER_ADDR")
    results, addrs = _torchrun_two_nodes(addr if master == "address" else socket.gethostname())
    _expect_two_nodes(results)
    assert addrs[0]["rendezvous"] == addr if master == "address" else not addrs[0]["rendezvous"].startswith("127.")
    for r, a in addrs.items():
        assert a["host"] == f"node-{r // 2}" and a["transport"] == "hierarchical", (r, a)
        assert not a["bind"].startswith("127."), (r, a)  # data connections from the other node must reach it
