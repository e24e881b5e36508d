"""``hora job`` inside a Slurm allocation (``hora job run --slurm``), on a real one-node Slurm cluster (the ``slurm``
fixture, tests/support/slurm_cluster.py): the allocation's node becomes algo-1 and everything the host runs is a job
step started with srun (:mod:`hora.jobs._srun_rsh`). The job's work dir is a directory of the test's own, so the
shared file system cannot hide a tree that was not shipped."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("sagemaker_training", reason="the toolkit check needs sagemaker-training (the test extra)")
yaml = pytest.importorskip("yaml", reason="the spec file needs PyYAML (the jobs extra)")

from hora.jobs import JobStore  # noqa: E402 - after the skips
from hora.jobs.api import reconcile  # noqa: E402
from hora.jobs.cluster import runtime_dir  # noqa: E402
from support.slurm_cluster import job_steps  # noqa: E402

LIMIT = 240.0

SCRIPT = textwrap.dedent("""
    import json, os, socket, sys, time
    import numpy as np
    import hora.numpy as hvd
    from sagemaker_training import environment

    hvd.init()
    env = environment.Environment()
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    iface = os.environ["SM_NETWORK_INTERFACE_NAME"]
    seen = {"hosts": env.hosts, "current_host": env.current_host, "interface": env.network_interface_name,
            "sm_interface": iface, "real_interface": os.path.isdir(f"/sys/class/net/{iface}"),
            "allreduce": float(total[0]), "size": hvd.size(), "hostname": socket.gethostname(),
            "data": open(os.path.join(os.environ["SM_CHANNEL_TRAINING"], "a.txt")).read(),
            "model_dir": env.model_dir, "step": os.environ.get("SLURM_STEP_ID"), "job": os.environ.get("SLURM_JOB_ID")}
    with open(os.path.join(env.model_dir, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(seen, f)
    print(f"loss={0.5 + hvd.rank()}", flush=True)
    if os.environ.get("SM_HP_SLEEP"):
        print("ready", flush=True)
        time.sleep(600)
""")


def _spec(tmp_path: Path, name: str, **extra: object) -> Path:
    src, data = tmp_path / "src", tmp_path / "data"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(SCRIPT)
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("channel data")
    spec = {
        "entry_point": "train.py", "source_dir": str(src), "job_name": name,
        "instance_count": 1, "processes_per_host": 2,
        "distribution": {"mpi": {"enabled": True, "processes_per_host": 2}},
        "inputs": {"training": str(data)},
        "metric_definitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
        "cluster": {"slurm": True, "work_dir": str(tmp_path / "remote-{host}")},
        **extra,
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _hora_job(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "hora", "job", "--home", str(home), *args]


def _left(marker: str) -> list[str]:
    """Processes whose command line names the job (its ranks' wrappers, the agents, the srun steps)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in cmdline and int(pid) != os.getpid():
            out.append(f"{pid}: {cmdline!r}")
    return out


def test_a_job_in_an_allocation_runs_the_contract_on_its_node_and_archives_home(slurm, tmp_path):
    """salloc -N1 hora job run SPEC --slurm: algo-1 is the allocation's node, its two ranks (a step started with
    srun) see the SageMaker contract and allreduce; the model comes home; no step is left; clean --slurm works."""
    name, home = f"slurm-{uuid.uuid4().hex[:6]}", tmp_path / "home"
    spec = _spec(tmp_path, name, profiler_config={"system_monitor_interval_millis": 200})
    script = " ".join([
        *_hora_job(home, "run", str(spec), "--slurm"), "; rc=$?;",
        "echo \"STEPS: $(squeue -h -s -j $SLURM_JOB_ID -o %i)\";",
        *_hora_job(home, "clean", "--slurm", "--work-dir", str(tmp_path / "remote-{host}")), "&& exit $rc",
    ])  # fmt: skip
    proc = subprocess.run(["salloc", "-N1", "-t", "10", "-J", name, "/bin/sh", "-c", script], env=slurm,
                          capture_output=True, text=True, timeout=LIMIT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the job runs in the foreground (as --wait)" in proc.stderr
    assert "STEPS: \n" in proc.stdout, proc.stdout  # every step of the job ended with it
    record = JobStore(home).get(name)
    assert record.status == "Completed", record.failure_reason
    with tarfile.open(record.artifacts["model"]) as tar:
        seen = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()}  # type: ignore[arg-type]
    assert sorted(seen) == ["rank-0.json", "rank-1.json"]
    node = slurm_node(slurm)
    for got in seen.values():
        assert (got["hosts"], got["current_host"], got["size"], got["allreduce"]) == (["algo-1"], "algo-1", 2, 3.0)
        assert got["interface"] == got["sm_interface"] and got["real_interface"] is True, got
        assert got["data"] == "channel data"
        assert got["model_dir"] == str(tmp_path / f"remote-{node}" / name / "hosts" / "algo-1" / "model")
        assert got["hostname"] == "algo-1"  # run as root: the host's names, as on SageMaker
        assert got["job"] is not None and got["step"] is None  # in the allocation, not Slurm tasks of a step
    job_log = (Path(record.job_dir) / "logs" / "job.log").read_text()
    assert f"node(s) {node}, each host's processes started there as job steps with srun" in job_log
    assert f"algo-1 is {node}: {tmp_path / f'remote-{node}' / name}" in job_log
    assert "[algo-1 rank 1]<stdout> loss=1.5" in (Path(record.job_dir) / "logs" / "algo-1.log").read_text()
    assert sorted(v for _, v, *_ in JobStore(home).metrics(name)) == [0.5, 1.5]
    assert {h for h, *_ in JobStore(home).iter_system_metrics(name)} == {"algo-1"}  # sampled on the node, sent home
    assert not (tmp_path / f"remote-{node}").exists()  # hora job clean --slurm
    assert not _left(name)


def slurm_node(env: dict[str, str]) -> str:
    out = subprocess.run(["sinfo", "-h", "-o", "%N"], env=env, capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_stop_ends_every_step_and_a_node_srun_cannot_reach_fails_the_job_naming_it(slurm, tmp_path):
    """In one allocation (salloc --no-shell; the test is its shell): hora job stop ends the job's srun steps (none
    left in squeue -s, no process of the job left), so do the supervisor's death (SIGKILL) and hora run's SIGKILL to
    an agent's process group; a node srun cannot start a step on fails the job naming it."""
    name, home = f"slstop-{uuid.uuid4().hex[:6]}", tmp_path / "home"
    got = subprocess.run(["salloc", "--no-shell", "-N1", "-t", "10", "-J", name], env=slurm, capture_output=True,
                         text=True, timeout=LIMIT)
    assert got.returncode == 0, got.stderr
    job_id = got.stderr.split("Granted job allocation")[1].split()[0]
    inside = {**slurm, "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": slurm_node(slurm)}
    try:
        proc = _start_sleeping(tmp_path, home, name, inside)
        try:
            assert job_steps(slurm, job_id)  # the host's agent runs as a step
            stop = subprocess.run(_hora_job(home, "stop", name), capture_output=True, text=True, timeout=LIMIT)
            assert stop.returncode == 0, stop.stderr
            _, stderr = proc.communicate(timeout=LIMIT)
        finally:
            _end(proc)
        assert proc.returncode == 1, stderr
        record = JobStore(home).get(name)
        assert (record.status, record.failure_reason) == ("Stopped", "stopped by request (hora job stop)")
        with tarfile.open(record.artifacts["model"]) as tar:  # written before the stop, brought home after it
            assert sorted(tar.getnames()) == ["rank-0.json", "rank-1.json"]
        assert _settled(lambda: job_steps(slurm, job_id)) == []
        assert _settled(lambda: _left(name) + _left(f"--jobid={job_id} ") + _left(f"_srun_rsh {job_id} ")) == []

        # the supervisor killed outright: its srun agents die with it, and srun's shepherd cancels each step
        killed = f"{name}-killed"
        proc = _start_sleeping(tmp_path, home, killed, inside)
        proc.kill()
        _end(proc)
        assert _settled(lambda: job_steps(slurm, job_id)) == []
        assert _settled(lambda: _left(killed) + _left(f"--jobid={job_id} ") + _left(f"_srun_rsh {job_id} ")) == []
        store = JobStore(home)  # the next look at the job marks it Failed and removes what the supervisor left in /tmp
        assert reconcile(store, store.get(killed)).status == "Failed"
        assert not runtime_dir(store.get(killed).job_dir).exists()

        # hora run ends a host whose session does not close by killing its agent's process group: the step ends.
        # The command's first output has no newline: it comes at once all the same (a raw pty, srun --unbuffered)
        marker = f"{name}-agent"
        command = f"printf {marker}; exec {sys.executable} -c 'import time; time.sleep(300)' {marker}"
        agent = subprocess.Popen([sys.executable, "-m", "hora.jobs._srun_rsh", job_id, inside["SLURM_JOB_NODELIST"],
                                  command], env=inside, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 start_new_session=True)
        try:
            assert agent.stdout is not None
            assert _read_until(agent.stdout.fileno(), marker.encode()) == marker.encode()
            assert job_steps(slurm, job_id)
            os.killpg(agent.pid, signal.SIGKILL)
        finally:
            _end(agent)
        assert _settled(lambda: job_steps(slurm, job_id)) == []
        assert _settled(lambda: _left(marker) + _left(f"--jobid={job_id} ")) == []

        # a node the allocation does not have (as a node that is down): srun cannot start the host's step there
        lost = f"{name}-gone"
        spec = _spec(tmp_path, lost)
        done = subprocess.run(_hora_job(home, "run", str(spec), "--slurm"), capture_output=True, text=True,
                              env={**inside, "SLURM_JOB_NODELIST": "nosuchnode"}, timeout=LIMIT)
        assert done.returncode == 1, done.stderr
        reason = JobStore(home).get(lost).failure_reason or ""
        assert "failed the host check" in reason and "host nosuchnode: hora job: node nosuchnode: srun could not " \
            f"start a step of Slurm job {job_id} there" in reason, reason
        assert _settled(lambda: job_steps(slurm, job_id)) == []
    finally:
        subprocess.run(["scancel", job_id], env=slurm, capture_output=True, timeout=60)


def _start_sleeping(tmp_path: Path, home: Path, name: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``hora job run --slurm`` of a job whose two ranks sleep, returned once both are ready."""
    spec = _spec(tmp_path, name, hyperparameters={"sleep": 1}, stop_grace=5)
    proc = subprocess.Popen(_hora_job(home, "run", str(spec), "--slurm"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ready, deadline = 0, time.monotonic() + LIMIT
    assert proc.stdout is not None
    while ready < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        ready += line.rstrip().endswith("] ready")
    if ready < 2:
        _end(proc)
        pytest.fail(f"the job did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc


def _end(proc: subprocess.Popen) -> None:
    if proc.returncode is None:  # not yet waited for
        proc.kill()
        proc.communicate()


def _read_until(fd: int, wanted: bytes, seconds: float = LIMIT) -> bytes:
    """What ``fd`` gives until it holds ``wanted`` (or ends, or ``seconds`` pass)."""
    got, deadline = b"", time.monotonic() + seconds
    while wanted not in got and (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            got += chunk
    return got


def _settled(check, seconds: float = 30.0):
    """``check()`` until it returns something empty or ``seconds`` pass (Slurm takes a moment to forget a step)."""
    deadline = time.monotonic() + seconds
    while (left := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_outside_an_allocation_it_says_how_to_get_one(tmp_path, monkeypatch):
    for var in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(var)
    spec = _spec(tmp_path, "outside", instance_count=2)
    done = subprocess.run(_hora_job(tmp_path / "home", "run", str(spec), "--slurm"), capture_output=True, text=True,
                          timeout=LIMIT)
    assert done.returncode == 2
    assert (f"hora job run {spec} --slurm" in done.stderr and "salloc -N 2" in done.stderr
            and "sbatch script (#SBATCH -N 2" in done.stderr), done.stderr
