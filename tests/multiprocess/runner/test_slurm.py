"""A real single-node Slurm cluster (slurmctld + slurmd started here with a generated config): hora under ``srun``,
and ``hora run`` inside an allocation taking its hosts and slots from ``SLURM_JOB_NODELIST``.

Needs root (slurmd runs jobs as their user) and the slurm-wlm binaries; .ci/run installs them. Authentication is
``auth/none`` where this Slurm has that plugin (Debian's 22.05 does); otherwise (or with HORA_TEST_SLURM_AUTH=munge)
a private ``munged`` with a freshly generated key and its own socket. The cluster listens on free ports of 127.0.0.1
only and lives in a temporary directory that is removed afterwards, with every daemon stopped by pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from glob import glob
from pathlib import Path

import pytest

from support.report import REPORT, clean_env, expect, parse

pytestmark = [
    pytest.mark.skipif(
        any(shutil.which(b) is None for b in ("slurmctld", "slurmd", "srun", "salloc", "sinfo")),
        reason="Slurm (slurm-wlm: slurmctld, slurmd, srun, salloc) is not installed",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="a private Slurm cluster's slurmd must run as root"),
]

NTASKS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _has_auth_none() -> bool:
    if os.environ.get("HORA_TEST_SLURM_AUTH") == "munge":
        return False
    patterns = ("/usr/lib/*/slurm-wlm/auth_none.so", "/usr/lib*/slurm*/auth_none.so", "/usr/local/lib*/slurm/auth_none.so")
    return any(glob(p) for p in patterns)


def _config(tmp: Path, node: str, cpus: int, munge_socket: str | None) -> str:
    auth = (
        f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={munge_socket}"
        if munge_socket
        else "AuthType=auth/none\nCredType=cred/none"
    )
    return f"""\
ClusterName=horatest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
{auth}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:{cpus}
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running one-node cluster; yields the environment that points srun/salloc at it."""
    tmp = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool", "log"):
        (tmp / d).mkdir()
    node = socket.gethostname().split(".")[0]
    conf = tmp / "slurm.conf"
    munge_socket = None
    munge_dir: Path | None = None
    if not _has_auth_none():
        if shutil.which("munged") is None:
            pytest.skip("this Slurm has no auth/none plugin and munge (munged) is not installed")
        # munged wants every directory above its socket searchable by all (pytest's tmp_path is 0700).
        munge_dir = Path(tempfile.mkdtemp(prefix="hora-munge-"))
        munge_dir.chmod(0o755)
        key = tmp / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = str(munge_dir / "socket")
    conf.write_text(_config(tmp, node, max(NTASKS, os.cpu_count() or 1), munge_socket))
    env = clean_env(SLURM_CONF=str(conf))
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        if munge_socket:
            m = tmp / "log"
            with open(m / "munged.err", "wb") as err:
                daemons.append(subprocess.Popen(
                    ["munged", "-F", f"--key-file={tmp / 'munge.key'}", f"--socket={munge_socket}",
                     f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}"],
                    env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True))
            deadline = time.monotonic() + 30
            while not os.path.exists(munge_socket) and time.monotonic() < deadline and daemons[0].poll() is None:
                time.sleep(0.1)
            if not os.path.exists(munge_socket):
                pytest.fail(f"munged did not create its socket {munge_socket} within 30s: "
                            f"{(tmp / 'log' / 'munged.err').read_text()[-2000:]}")
        # -D: stay in the foreground, so they are our children and stop by pid; -i: ignore stale state.
        for argv in (["slurmctld", "-D", "-i", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf)]):
            daemons.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            dead = [d.args[0] for d in daemons if d.poll() is not None]
            if dead:
                break
            proc = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True, text=True,
                                  timeout=30)
            state = proc.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        if state != "idle":
            logs = "\n".join(p.read_text()[-2000:] for p in (tmp / "log").glob("*.log"))
            pytest.fail(f"the test's Slurm node never became idle (state {state!r}); logs:\n{logs}")
        yield env
    finally:
        for d in reversed(daemons):  # slurmd first (it ends its job steps), munged last
            _stop(d)
        shutil.rmtree(tmp, ignore_errors=True)
        if munge_dir is not None:
            shutil.rmtree(munge_dir, ignore_errors=True)


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
