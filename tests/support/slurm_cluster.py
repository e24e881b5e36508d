"""A real single-node Slurm cluster for tests: slurmctld + slurmd started here with a generated config.

Needs root (slurmd runs jobs as their user) and the slurm-wlm binaries; .ci/run installs them. Authentication is
``auth/none`` where this Slurm has that plugin (Debian's 22.05 does); otherwise (or with HORA_TEST_SLURM_AUTH=munge)
a private ``munged`` with a freshly generated key and its own socket. The cluster listens on free ports of 127.0.0.1
only and lives in a temporary directory that is removed afterwards, with every daemon stopped by pid.

:func:`unavailable` says why it cannot be built here ('' when it can); :func:`start_cluster` builds it and returns a
:class:`SlurmCluster` whose :attr:`~SlurmCluster.env` points srun/salloc/sbatch/squeue at it. tests/conftest.py
serves it as the session fixture ``slurm`` (that environment).
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
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path

from support.report import clean_env

#: CPUs the node offers at least (tests start up to this many tasks on it).
MIN_CPUS = 4
_TOOLS = ("slurmctld", "slurmd", "srun", "salloc", "sbatch", "squeue", "sinfo")


def unavailable() -> str:
    """Why the cluster cannot be built here ('' when it can)."""
    missing = [b for b in _TOOLS if shutil.which(b) is None]
    if missing:
        return f"Slurm (slurm-wlm: {', '.join(missing)}) is not installed"
    if os.geteuid() != 0:
        return "a private Slurm cluster's slurmd must run as root"
    if not _has_auth_none() and shutil.which("munged") is None:
        return "this Slurm has no auth/none plugin and munge (munged) is not installed"
    return ""


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


@dataclass
class SlurmCluster:
    """The running cluster: its one node's name, the environment that points Slurm's commands at it, and what
    :meth:`close` stops and removes."""

    node: str
    env: dict[str, str]
    tmp: Path
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    munge_dir: Path | None = None

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.tmp / "log").glob("*.log")))

    def close(self) -> None:
        for d in reversed(self.daemons):  # slurmd first (it ends its job steps), munged last
            _stop(d)
        self.daemons = []
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)


def start_cluster(cpus: int = MIN_CPUS) -> SlurmCluster:
    """Start the daemons and wait (up to 60 s) until the node is idle.

    Raises:
        RuntimeError: a daemon did not come up; the message holds its log.
    """
    tmp = Path(tempfile.mkdtemp(prefix="hora-slurm-"))
    for d in ("state", "spool", "log"):
        (tmp / d).mkdir()
    node = socket.gethostname().split(".")[0]
    conf = tmp / "slurm.conf"
    cluster = SlurmCluster(node, clean_env(SLURM_CONF=str(conf)), tmp)
    try:
        munge_socket = None if _has_auth_none() else _start_munge(cluster)
        conf.write_text(_config(tmp, node, max(cpus, os.cpu_count() or 1), munge_socket))
        # -D: stay in the foreground, so they are our children and stop by pid; -i: ignore stale state.
        for argv in (["slurmctld", "-D", "-i", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf)]):
            cluster.daemons.append(subprocess.Popen(argv, env=cluster.env, stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                    start_new_session=True))
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline and all(d.poll() is None for d in cluster.daemons):
            proc = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=cluster.env, capture_output=True,
                                  text=True, timeout=30)
            state = proc.stdout.strip()
            if state == "idle":
                return cluster
            time.sleep(0.5)
        raise RuntimeError(f"the test's Slurm node never became idle (state {state!r}); logs:\n{cluster.logs()}")
    except BaseException:
        cluster.close()
        raise


def _start_munge(cluster: SlurmCluster) -> str:
    """A private munged with a fresh key; returns its socket."""
    # munged wants every directory above its socket searchable by all (the temporary directory is 0700).
    cluster.munge_dir = Path(tempfile.mkdtemp(prefix="hora-munge-"))
    cluster.munge_dir.chmod(0o755)
    key = cluster.tmp / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = str(cluster.munge_dir / "socket")
    m = cluster.tmp / "log"
    with open(m / "munged.err", "wb") as err:
        cluster.daemons.append(subprocess.Popen(
            ["munged", "-F", f"--key-file={key}", f"--socket={munge_socket}", f"--pid-file={m / 'munged.pid'}",
             f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}"],
            env=cluster.env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True))
    deadline = time.monotonic() + 30
    while not os.path.exists(munge_socket) and time.monotonic() < deadline and cluster.daemons[0].poll() is None:
        time.sleep(0.1)
    if not os.path.exists(munge_socket):
        raise RuntimeError(f"munged did not create its socket {munge_socket} within 30s: "
                           f"{(m / 'munged.err').read_text()[-2000:]}")
    return munge_socket


def job_steps(env: dict[str, str], job_id: str) -> list[str]:
    """The running steps of Slurm job ``job_id`` (``squeue -s``: ``JOBID.STEPID NAME NODES``), [] when none."""
    proc = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j %N"], env=env, capture_output=True,
                          text=True, timeout=30)
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


if __name__ == "__main__":  # a cluster to try things against by hand: prints SLURM_CONF, stops on Ctrl-C or SIGTERM
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the daemons are stopped below, not left running
    c = start_cluster()
    print(f"export SLURM_CONF={c.env['SLURM_CONF']}  # node {c.node}", flush=True)
    try:
        signal.pause()
    finally:
        c.close()
