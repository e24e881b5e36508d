"""A job's hosts as process trees of their own: the master starts the ranks across the hosts, the others wait for it
(and say so when it never comes), only the job's secret opens a host, and a dying master leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hora._runtime.auth import Role, client_handshake
from hora.errors import AuthenticationError
from hora.jobs import JobStore, parse_spec, start_job, stop_job, wait_job
from hora.jobs.cluster import runtime_dir, socket_path
from hora.jobs.lifecycle import JobSupervisor


def _spec(tmp_path: Path, script: str, name: str, **fields):
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "train.py").write_text(textwrap.dedent(script))
    return parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name, "instance_count": 2,
                       "distribution": {"mpi": {"enabled": True, "processes_per_host": 2}}, **fields})


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text in cmdline and ") Z" not in stat:
            found.append(f"{entry.name}: {cmdline}")
    return found


class _Prepared:
    """A job set up as far as its hosts' start (directories, addresses, namespaces, plan, secret), not run."""

    def __init__(self, tmp_path: Path, **fields) -> None:
        spec = _spec(tmp_path, "print('never runs')\n", "prepared", **fields)
        self.runner = JobSupervisor(spec, JobStore(tmp_path / "home"), echo=False)
        (self.runner.job_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.runner.job_dir / "hora").mkdir(parents=True, exist_ok=True)
        self.runner._log_file = open(self.runner.job_dir / "logs" / "job.log", "a")  # noqa: SIM115
        self.runner._setup_hosts()
        self.runner._write_plan()
        (self.runner.job_dir / "hora" / "secret").write_text(os.urandom(32).hex())
        socket_path(self.runner.job_dir, "algo-2").parent.mkdir(mode=0o700, parents=True, exist_ok=True)

    def start_host(self, host: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "hora.jobs._host", str(self.runner.job_dir), host, "1"],
                                env=self.runner._launch_env(1), stderr=subprocess.PIPE, text=True)

    def close(self) -> None:
        if self.runner._net is not None:
            self.runner._net.remove()
        self.runner._log_file.close()
        shutil.rmtree(runtime_dir(self.runner.job_dir), ignore_errors=True)  # the sockets' directory in /tmp


@pytest.fixture
def prepared(tmp_path):
    jobs: list[_Prepared] = []

    def make(**fields) -> _Prepared:
        jobs.append(_Prepared(tmp_path, **fields))
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


def test_a_host_whose_master_never_comes_says_so_and_ends(prepared):
    job = prepared(master_timeout=2)
    proc = job.start_host("algo-2")
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    assert "algo-2 waited 2s for the master host algo-1 to start the ranks and it never did" in err
    report = json.loads((job.runner.job_dir / "hora" / "attempt-1" / "host-algo-2.json").read_text())
    assert report["host"] == "algo-2" and "raise master_timeout" in report["error"]
    assert not socket_path(job.runner.job_dir, "algo-2").exists()


def test_a_host_serves_only_the_jobs_secret_and_stops_on_sigterm(prepared):
    job = prepared(master_timeout=120)
    proc = job.start_host("algo-2")
    try:
        path = socket_path(job.runner.job_dir, "algo-2")
        deadline = time.monotonic() + 30
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.exists(), proc.stderr.read() if proc.poll() is not None else "no socket"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            with pytest.raises(AuthenticationError, match="rejected"):
                client_handshake(s, b"x" * 32, Role.AGENT, 0, 10.0)
        with socket.socket(socket.AF_UNIX) as s:  # the right secret but another role: refused too
            s.connect(str(path))
            secret = bytes.fromhex((job.runner.job_dir / "hora" / "secret").read_text())
            with pytest.raises(AuthenticationError):
                client_handshake(s, secret, Role.RENDEZVOUS, 0, 10.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "refused a connection" in err and "failed authentication" in err


def test_reaching_a_host_that_is_not_up_fails_like_ssh(prepared):
    job = prepared()
    env = {**os.environ, "HORA_JOB_CONNECT_TIMEOUT": "1"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hora.jobs._rsh", str(job.runner.job_dir), "algo-2", "echo hi"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 255 and out.stdout == ""
    assert "host algo-2 did not come up within 1s: its agent does not listen at" in out.stderr
    assert time.monotonic() - started < 30


TREE = """
    import json, os
    import hora.numpy as hvd

    def ancestry():
        pid, chain = os.getpid(), []
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                chain.append(f.read().replace(b"\\0", b" ").decode())
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return chain

    hvd.init()
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"tree-{hvd.rank()}.json"), "w") as f:
        json.dump(ancestry(), f)
    hvd.shutdown()
"""


def test_every_rank_descends_from_its_own_hosts_process_tree(tmp_path):
    store = JobStore(tmp_path / "home")
    record = start_job(_spec(tmp_path, TREE, "trees"), store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    for rank in range(4):
        host = f"algo-{rank // 2 + 1}"
        chain = json.loads((store.job_dir("trees") / "hosts" / host / "output" / "data" / f"tree-{rank}.json").read_text())
        agents = [c for c in chain if "hora.jobs._host" in c]
        assert len(agents) == 1 and agents[0].split()[-2] == host, chain
        if host == "algo-2":  # started by algo-1's hora run through algo-2's agent, not by algo-1 itself
            assert any("hora.runner.host_agent" in c for c in chain), chain


SUICIDE = """
    import os, signal, time
    import hora.numpy as hvd

    hvd.init()
    if hvd.rank() == 0:
        wrapper = os.getppid()
        with open(f"/proc/{wrapper}/stat") as f:
            master_agent = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(master_agent, signal.SIGKILL)
    time.sleep(120)
"""


def test_the_master_host_dying_fails_the_job_and_leaves_nothing_behind(tmp_path):
    store = JobStore(tmp_path / "home")
    started = time.monotonic()
    record = start_job(_spec(tmp_path, SUICIDE, "master-dies", stop_grace=3), store, wait=True, echo=False)
    assert time.monotonic() - started < 100
    assert (record.status, record.secondary_status) == ("Failed", "Failed")
    assert record.failure_reason.startswith("HostError: the job's hosts failed:")
    assert "the master host algo-1 ended (killed by SIGKILL" in record.failure_reason
    assert record.artifacts["model"].endswith("model.tar.gz")
    assert _processes_mentioning(str(store.job_dir("master-dies"))) == []


POLITE = """
    import os, signal, sys, time

    def on_term(*_):
        open(os.path.join(os.environ["SM_MODEL_DIR"], f"term-{os.environ['HORA_RANK']}"), "w").write("15")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(os.environ["SM_MODEL_DIR"], f"up-{os.environ['HORA_RANK']}"), "w").close()
    while True:
        time.sleep(0.05)
"""


def test_a_stop_reaches_the_scripts_on_every_host_with_sigterm(tmp_path):
    store = JobStore(tmp_path / "home")
    start_job(_spec(tmp_path, POLITE, "polite", stop_grace=30), store, wait=False)
    models = [store.job_dir("polite") / "hosts" / f"algo-{rank // 2 + 1}" / "model" for rank in range(4)]
    deadline = time.monotonic() + 120
    while not all((m / f"up-{rank}").exists() for rank, m in enumerate(models)):
        assert time.monotonic() < deadline and not store.get("polite").done, store.get("polite").failure_reason
        time.sleep(0.1)
    stop_job(store, "polite")
    record = wait_job(store, "polite", timeout=120)
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped"), record.failure_reason
    for rank, model in enumerate(models):
        assert (model / f"term-{rank}").read_text() == "15", sorted(p.name for p in model.iterdir())
    assert _processes_mentioning(str(store.job_dir("polite"))) == []


def test_a_hosts_agent_under_fuzz_keeps_serving_the_master(prepared):
    """The agent's listener gets the fuzz of tests/unit/runtime/test_fuzz.py: garbage, truncated and forged
    handshakes, and authenticated requests that are garbage; the real client is still served."""
    import random

    from support.fuzz import frame_case, handshake_case

    job = prepared(master_timeout=120)
    proc = job.start_host("algo-2")
    rng = random.Random(4)
    try:
        path = socket_path(job.runner.job_dir, "algo-2")
        deadline = time.monotonic() + 30
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.exists(), "no socket"
        secret = bytes.fromhex((job.runner.job_dir / "hora" / "secret").read_text())
        for _ in range(150):
            kind = rng.randrange(3)
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(str(path))
                try:
                    if kind == 0:
                        s.sendall(rng.randbytes(rng.randrange(0, 200)))
                    elif kind == 1:
                        s.recv(37)
                        s.sendall(handshake_case(rng, secret))
                    else:
                        client_handshake(s, secret, Role.AGENT, 0, 10.0)
                        s.sendall(frame_case(rng))  # a request without its file descriptors
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            client_handshake(s, secret, Role.AGENT, 0, 10.0)  # still served
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err
