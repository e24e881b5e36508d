"""``hora job`` on real hosts over SSH (the spec's ``cluster:``, ``hora job run --hosts``), on network-namespace hosts
with their own sshd (fixtures: tests/support/netns_hosts.py; two hosts, three for the host cut off mid-job). Each
host keeps its job directory under a directory of its own (``work_dir`` with ``{host}``), so the shared file system
cannot hide a tree that was not shipped."""

from __future__ import annotations

import json
import os
import re
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

from hora.jobs import Estimator, JobStore, parse_spec, start_job, wait_job  # noqa: E402 - after the skips
from support import netns_hosts as netns  # noqa: E402

LIMIT = 240.0

SCRIPT = textwrap.dedent("""
    import json, os, socket, sys
    import numpy as np
    import hora.numpy as hvd
    from sagemaker_training import environment
    import helper
    from hora.data import PipeDataset

    hvd.init()
    streamed = list(PipeDataset("stream")) if hvd.local_rank() == 0 else None  # one reader per FIFO
    env = environment.Environment()
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    data = open(os.path.join(os.environ["SM_CHANNEL_TRAINING"], "a.txt")).read()
    seen = {"hosts": env.hosts, "current_host": env.current_host, "interface": env.network_interface_name,
            "sm_hosts": json.loads(os.environ["SM_HOSTS"]), "sm_current": os.environ["SM_CURRENT_HOST"],
            "model_dir": env.model_dir, "allreduce": float(total[0]), "data": data, "helper": helper.VERSION,
            "hp": env.hyperparameters["lr"], "streamed": streamed,
            "names": [socket.gethostbyname(h) for h in env.hosts], "hostname": socket.gethostname(),
            "opt_ml": os.path.isfile("/opt/ml/code/train.py")}
    with open(os.path.join(env.model_dir, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(seen, f)
    print(f"loss={0.5 + hvd.rank()}", flush=True)
    if os.environ.get("SM_HP_SLEEP"):
        print("ready", flush=True)
        import time
        time.sleep(600)
""")


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(SCRIPT)
    (src / "helper.py").write_text("VERSION = 1\n")
    (src / "big.bin").write_bytes(os.urandom(200_000))
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("channel data")
    stream = tmp_path / "stream"
    stream.mkdir()
    (stream / "a.txt").write_text("one\ntwo\n")
    (stream / "b.txt").write_text("three\n")
    return src


def _spec(c: netns.Cluster, tmp_path: Path, name: str, **extra: object) -> dict[str, object]:
    return {
        "entry_point": "train.py", "source_dir": str(tmp_path / "src"), "job_name": name,
        "instance_count": len(c.hosts), "processes_per_host": 2,
        "distribution": {"mpi": {"enabled": True, "processes_per_host": 2}},
        "hyperparameters": {"lr": 0.25}, "inputs": {"training": str(tmp_path / "data"),
                   "stream": {"uri": str(tmp_path / "stream"), "input_mode": "Pipe"}},
        "metric_definitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
        "cluster": {"hosts": [h.addr for h in c.hosts], "ssh_identity_file": c.key,
                    "ssh_options": [f"UserKnownHostsFile={c.known_hosts}", "StrictHostKeyChecking=yes"],
                    "work_dir": str(tmp_path / "remote-{host}")},
        **extra,
    }  # fmt: skip


def _shipped(job_log: str) -> dict[str, set[str]]:
    """host -> the files the job shipped to it (config files, rewritten for every job, left out)."""
    out = {}
    for m in re.finditer(r"(algo-\d) \(\S+\): shipped \d+ changed file\(s\), \d+ bytes(?:: (.*))?", job_log):
        files = {f.strip() for f in (m.group(2) or "").split(",") if f.strip()}
        out[m.group(1)] = {f for f in files if not f.startswith("input/config/")}
    return out


def _leftovers(c: netns.Cluster, marker: str) -> list[str]:
    extra = {pid for h in c.hosts for pid in c.processes_in(h.netns) - {h.pid}}
    extra |= {pid for pid, _ in netns.job_processes("", marker)}
    described = []
    for pid in sorted(extra):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            described.append(f"{pid}: {cmdline!r}")
        except OSError:
            pass
    return described


def _wait_clean(c: netns.Cluster, marker: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while (left := _leftovers(c, marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "processes left behind on the hosts:\n" + "\n".join(left)


def test_two_hosts_run_the_contract_archive_home_and_a_rerun_ships_only_a_change(netns_cluster, tmp_path, capfd):
    c = netns_cluster
    _source(tmp_path)
    store = JobStore(tmp_path / "home")
    name = f"rmt-{uuid.uuid4().hex[:6]}"
    record = start_job(parse_spec(_spec(c, tmp_path, f"{name}-1",
                                        profiler_config={"system_monitor_interval_millis": 200})),
                       store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    # every host got its own tree, in its own directory (never the other host's)
    for i, h in enumerate(c.hosts):
        job = tmp_path / f"remote-{h.addr}" / f"{name}-1"
        assert (job / "hosts" / f"algo-{i + 1}" / "code" / "train.py").is_file()
        assert not (job / "hosts" / f"algo-{2 - i}").exists()
    # the model of every rank, pulled from both hosts and archived here
    with tarfile.open(record.artifacts["model"]) as tar:
        seen = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()}  # type: ignore[arg-type]
    assert sorted(seen) == [f"rank-{r}.json" for r in range(4)]
    for r in range(4):
        got, host = seen[f"rank-{r}.json"], f"algo-{r // 2 + 1}"
        assert got["hosts"] == got["sm_hosts"] == ["algo-1", "algo-2"]
        assert got["current_host"] == got["sm_current"] == host
        assert got["interface"] == c.bridge  # the host's real interface towards the other host
        assert got["model_dir"] == str(tmp_path / f"remote-{c.hosts[r // 2].addr}" / f"{name}-1" / "hosts" / host
                                       / "model")
        assert (got["allreduce"], got["data"], got["helper"], got["hp"]) == (10.0, "channel data", 1, 0.25)
        assert got["streamed"] == (["one", "two", "three"] if r % 2 == 0 else None)  # fed on its host
        # run as root on the host: algo-K resolve, the host name is algo-K, the tree is at /opt/ml (as SageMaker)
        assert (got["names"], got["hostname"]) == ([h.addr for h in c.hosts], host)
        assert got["opt_ml"] is True
    # logs came home tagged, metrics were parsed here
    assert "rank 3]" not in capfd.readouterr().out  # echo=False: in the logs only, as for a local job
    logs = (Path(record.job_dir) / "logs" / "algo-2.log").read_text()
    assert "[algo-2 rank 3]<stdout> loss=3.5" in logs
    assert sorted(v for _, v, *_ in store.metrics(f"{name}-1")) == [0.5, 1.5, 2.5, 3.5]
    # each host sampled itself (its first rank's wrapper) and the samples came home into the store, not the logs
    system = list(store.iter_system_metrics(f"{name}-1"))
    assert {h for h, *_ in system} == {"algo-1", "algo-2"}
    assert all(0 <= v <= 100 for _, _, n, v in system if n.endswith("percent"))
    assert "system]" not in logs
    first = _shipped((Path(record.job_dir) / "logs" / "job.log").read_text())
    assert first["algo-1"] == first["algo-2"] == {"code/train.py", "code/helper.py", "code/big.bin",
                                                  "input/data/training/a.txt", ".pipe/stream/a.txt", ".pipe/stream/b.txt"}

    # a rerun with one file changed ships only that file to each host
    (tmp_path / "src" / "helper.py").write_text("VERSION = 2\n")
    record = start_job(parse_spec(_spec(c, tmp_path, f"{name}-2")), store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    assert _shipped((Path(record.job_dir) / "logs" / "job.log").read_text()) == {
        "algo-1": {"code/helper.py"}, "algo-2": {"code/helper.py"}}
    with tarfile.open(record.artifacts["model"]) as tar:
        assert json.load(tar.extractfile("rank-3.json"))["helper"] == 2  # type: ignore[arg-type]
    _wait_clean(c, name)

    # hora job clean removes the work dirs on every host
    cli = [sys.executable, "-m", "hora", "job", "clean", "--hosts", ",".join(h.addr for h in c.hosts),
           "--work-dir", str(tmp_path / "remote-{host}"), "-i", c.key,
           "--ssh-option", f"UserKnownHostsFile={c.known_hosts}", "--ssh-option", "StrictHostKeyChecking=yes"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 0, done.stderr
    assert not any((tmp_path / f"remote-{h.addr}").exists() for h in c.hosts)


def test_a_host_cut_off_mid_job_ends_it_naming_the_host(netns_cluster3, tmp_path):
    """Three hosts, the middle one cut off: the job ends naming it, and nothing is left on the hosts either side."""
    c = netns_cluster3
    _source(tmp_path)
    marker, home = f"cutoff-{uuid.uuid4().hex[:6]}", tmp_path / "home"
    proc = _start_sleeping(c, tmp_path, marker, home)
    link = f"hv{c.tag}2"  # the second host's end of its cable on the bridge
    try:
        subprocess.run(["ip", "link", "set", link, "down"], check=True, timeout=20)
        _, stderr = proc.communicate(timeout=LIMIT)
    finally:
        subprocess.run(["ip", "link", "set", link, "up"], check=True, timeout=20)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, stderr
    record = JobStore(home).get(marker)
    assert record.status == "Failed"
    assert f"lost the connection to host {c.hosts[1].addr}" in (record.failure_reason or ""), record.failure_reason
    assert "host algo-2" in (record.failure_reason or "")
    with tarfile.open(record.artifacts["model"]) as tar:  # archived even so, with what algo-1 and algo-3 had
        assert sorted(tar.getnames()) == ["rank-0.json", "rank-1.json", "rank-4.json", "rank-5.json"]
    job_log = (Path(record.job_dir) / "logs" / "job.log").read_text()
    assert f"could not bring back the results of attempt 1 from every host:\n  host {c.hosts[1].addr}: " in job_log
    _wait_clean(c, marker)


def _start_sleeping(c: netns.Cluster, tmp_path: Path, name: str, home: Path, *flags: str) -> subprocess.Popen[str]:
    """``hora job run --wait --hosts`` of a job of 2 ranks per host whose ranks sleep, returned once all are
    ready."""
    spec = _spec(c, tmp_path, name, hyperparameters={"lr": 0.25, "sleep": 1}, **({"stop_grace": 5} if flags else {}))
    spec["cluster"] = {k: v for k, v in spec["cluster"].items() if k != "hosts"}  # type: ignore[attr-defined]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hora", "job", "--home", str(home), "run", str(path), "--wait",
         "--hosts", ",".join(h.addr for h in c.hosts)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    ready, deadline = 0, time.monotonic() + LIMIT
    assert proc.stdout is not None
    while ready < 2 * len(c.hosts) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        ready += line.rstrip().endswith("] ready")
    if ready < 2 * len(c.hosts):
        proc.kill()
        pytest.fail(f"the job did not start: {proc.communicate()[1]}")
    return proc


def test_hora_job_stop_reaches_every_host_and_still_archives(netns_cluster, tmp_path):
    c = netns_cluster
    _source(tmp_path)
    name, home = f"stop-{uuid.uuid4().hex[:6]}", tmp_path / "home"
    proc = _start_sleeping(c, tmp_path, name, home, "grace")
    try:
        stop = subprocess.run([sys.executable, "-m", "hora", "job", "--home", str(home), "stop", name],
                              capture_output=True, text=True, timeout=LIMIT)
        assert stop.returncode == 0, stop.stderr
        _, stderr = proc.communicate(timeout=LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, stderr
    record = JobStore(home).get(name)
    assert (record.status, record.failure_reason) == ("Stopped", "stopped by request (hora job stop)")
    with tarfile.open(record.artifacts["model"]) as tar:  # what every host had written before the stop came home
        assert sorted(tar.getnames()) == [f"rank-{r}.json" for r in range(4)]
    _wait_clean(c, name)


def test_max_run_stops_every_host_and_still_archives_what_they_wrote(netns_cluster, tmp_path):
    """SageMaker's MaxRuntimeExceeded on real hosts: the timer stops the ranks on every host (SIGTERM, SIGKILL after
    stop_grace) and what each host wrote comes home and is archived."""
    c = netns_cluster
    _source(tmp_path)
    name, store = f"maxrun-{uuid.uuid4().hex[:6]}", JobStore(tmp_path / "home")
    spec = _spec(c, tmp_path, name, hyperparameters={"lr": 0.25, "sleep": 1}, max_run=20, stop_grace=5)
    record = start_job(parse_spec(spec), store, wait=True, echo=False)
    assert (record.status, record.secondary_status) == ("Stopped", "MaxRuntimeExceeded"), record.failure_reason
    assert (record.failure_reason or "").startswith("MaxRuntimeExceeded: the job ran longer than max_run=20s")
    with tarfile.open(record.artifacts["model"]) as tar:  # written before the ranks slept, on both hosts
        assert sorted(tar.getnames()) == [f"rank-{r}.json" for r in range(4)]
    _wait_clean(c, name)


S3_SCRIPT = textwrap.dedent("""
    import json, os, sys
    if os.environ["HORA_JOB_ATTEMPT"] == "1":  # the first attempt fails, leaving a model file behind
        open(os.path.join(os.environ["SM_MODEL_DIR"], "stale.json"), "w").write("[]")
        sys.exit(3)
    shards = os.environ["SM_CHANNEL_SHARDS"]
    got = sorted(os.path.relpath(os.path.join(d, f), shards) for d, _, fs in os.walk(shards) for f in fs)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], os.environ["SM_CURRENT_HOST"] + ".json"), "w") as f:
        json.dump(got, f)
""")


def test_each_host_fetches_its_own_shard_of_an_s3_channel_and_a_retry_starts_afresh(netns_cluster, tmp_path):
    pytest.importorskip("boto3", reason="S3 channels need boto3 (the jobs extra)")
    pytest.importorskip("moto.server", reason="the S3 test needs moto[server] (the test extra)")
    import boto3

    c = netns_cluster
    src = tmp_path / "src"
    src.mkdir()
    (src / "shards.py").write_text(S3_SCRIPT)
    port, credentials = _free_port(c.root_addr), {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                                  "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", c.root_addr, "-p", str(port)],
                              env={**os.environ, **credentials}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{c.root_addr}:{port}"  # on the bridge: the hosts reach it too
        client = boto3.client("s3", endpoint_url=url, **{k.lower(): v for k, v in credentials.items()
                                                          if k != "AWS_DEFAULT_REGION"}, region_name="us-east-1")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket="data")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for key in ("shards/a.txt", "shards/b.txt"):
            client.put_object(Bucket="data", Key=key, Body=key.encode())
        spec = _spec(c, tmp_path, f"s3-{uuid.uuid4().hex[:6]}", entry_point="shards.py", processes_per_host=1,
                     distribution="none", metric_definitions=[],
                     inputs={"shards": {"uri": "s3://data/shards/", "distribution": "ShardedByS3Key"}},
                     environment={**credentials, "HORA_S3_ENDPOINT_URL": url}, max_retry_attempts=1)  # fmt: skip
        # through the SDK's API this time: Estimator(cluster=...) is the spec's cluster section
        estimator = Estimator(home=str(tmp_path / "home"),
                              **{k: v for k, v in spec.items() if k not in ("inputs", "job_name")})
        record = estimator.fit(spec["inputs"], job_name=str(spec["job_name"]), logs=False)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert (record.status, record.attempts) == ("Completed", 2), record.failure_reason
    with tarfile.open(record.artifacts["model"]) as tar:  # the retry's model only: model/ emptied on every host
        seen = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()}  # type: ignore[arg-type]
    assert sorted(seen) == ["algo-1.json", "algo-2.json"]
    assert re.search(r"attempt 1 failed; retrying\. AlgorithmError: host algo-(1, rank 0|2, rank 1) \(pid \d+\) failed "
                     "first: exit code 3", (Path(record.job_dir) / "logs" / "job.log").read_text())
    assert sorted(seen["algo-1.json"] + seen["algo-2.json"]) == ["a.txt", "b.txt"]
    assert len(seen["algo-1.json"]) == len(seen["algo-2.json"]) == 1
    for k in (1, 2):  # fetched by the hosts, never staged here
        assert not (Path(record.job_dir) / "hosts" / f"algo-{k}" / "input" / "data" / "shards").exists()


def _free_port(addr: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def test_tensorflows_parameter_servers_listen_on_each_hosts_address_with_the_containers_ports(netns_cluster, tmp_path):
    """The parameter_server distribution on real hosts: TF_CONFIG names each host's address with ports 2222 (worker)
    and 2223 (ps), every server answers, and a worker host keeps its server until the master's script has ended
    (it learns of that end from the master's server going away: the master's end record is on algo-1 only)."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("the parameter servers are TensorFlow's (the tensorflow extra)")
    from support import paths

    c = netns_cluster
    _source(tmp_path)
    (tmp_path / "src" / "census.py").write_text((paths.SCRIPTS / "tf_ps_census.py").read_text())
    out = tmp_path / "out"
    out.mkdir()
    name = f"ps-{uuid.uuid4().hex[:6]}"
    spec = _spec(c, tmp_path, name, entry_point="census.py", processes_per_host=1, metric_definitions=[],
                 distribution={"parameter_server": {"enabled": True}}, inputs={},
                 hyperparameters={"out": str(out), "mode": "census"}, max_run=240)  # fmt: skip
    record = start_job(parse_spec(spec), JobStore(tmp_path / "home"), wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    seen = {h: json.loads((out / f"{h}.json").read_text()) for h in ("algo-1", "algo-2")}
    a1, a2 = (h.addr for h in c.hosts)
    for index, host in enumerate(("algo-1", "algo-2")):
        assert seen[host]["tf_config"] == {
            "cluster": {"master": [f"{a1}:2222"], "ps": [f"{a1}:2223", f"{a2}:2223"], "worker": [f"{a2}:2222"]},
            "environment": "cloud", "task": {"index": 0, "type": "master" if index == 0 else "worker"},
        }
        assert seen[host]["ps_up"] == [True, True]
    assert seen["algo-1"]["ps_up_after_workers_ended"] == [True, True]
    _wait_clean(c, name)


SPOT_SCRIPT = textwrap.dedent("""
    import os, time
    ckpt = "/opt/ml/checkpoints" if os.path.isdir("/opt/ml/checkpoints") else os.path.join(
        os.environ["SM_MODEL_DIR"], "..", "checkpoints")
    path = os.path.join(ckpt, "epoch-" + os.environ["SM_CURRENT_HOST"])
    start = int(open(path).read()) if os.path.exists(path) else 0
    print(f"resumed at epoch {start}", flush=True)
    for epoch in range(start, 40):
        time.sleep(0.25)
        with open(path + ".tmp", "w") as f:
            f.write(str(epoch + 1))
        os.replace(path + ".tmp", path)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w").write("trained")
""")


def test_a_spot_reclaim_restarts_every_host_from_the_checkpoints_synced_while_it_ran(netns_cluster, tmp_path):
    """Managed spot on real hosts: the hosts' checkpoints are synced out to checkpoint_path while the job runs;
    a reclaim (hora job interrupt) stops every host, and the restart begins with new instances' trees: each host's
    checkpoints/ emptied and restored from checkpoint_path (both hosts' files), so each resumes where it was."""
    from hora.jobs.api import interrupt_job
    from hora.jobs.views import read_logs

    c = netns_cluster
    _source(tmp_path)
    (tmp_path / "src" / "spot.py").write_text(SPOT_SCRIPT)
    ckpt, store, name = tmp_path / "ckpt", JobStore(tmp_path / "home"), f"spot-{uuid.uuid4().hex[:6]}"
    spec = _spec(c, tmp_path, name, entry_point="spot.py", processes_per_host=1, metric_definitions=[],
                 distribution="none", inputs={}, use_spot_instances=True, max_run=200, max_wait=400,
                 checkpoint_path=str(ckpt), max_retry_attempts=0)  # fmt: skip
    start_job(parse_spec(spec), store, wait=False, echo=False)
    deadline = time.monotonic() + LIMIT

    def synced(host: str) -> int:
        try:
            return int((ckpt / f"epoch-{host}").read_text())
        except (OSError, ValueError):
            return 0

    while min(synced("algo-1"), synced("algo-2")) < 4:  # out while it runs: pulled from the hosts, then synced
        assert time.monotonic() < deadline and not store.get(name).done, store.get(name).failure_reason
        time.sleep(0.1)
    interrupt_job(store, name, "algo-2")
    record = wait_job(store, name, timeout=LIMIT)
    assert (record.status, record.attempts) == ("Completed", 2), record.failure_reason
    secondaries = [t[2] for t in store.transitions(name)]
    assert secondaries.count("Interrupted") == 1 and secondaries.count("Restarting") == 1
    logs = list(read_logs(store, name))
    for host in ("algo-1", "algo-2"):
        resumed = [int(line.rsplit(" ", 1)[1]) for line in logs if f"[{host} rank" in line and "resumed at" in line]
        assert len(resumed) == 2 and resumed[0] == 0 and resumed[1] >= 4, resumed  # from the synced checkpoint
        assert synced(host) == 40
    for h in c.hosts:  # new instances: each host got both hosts' checkpoints back from checkpoint_path
        tree = tmp_path / f"remote-{h.addr}" / name / "hosts"
        (algo,) = [p.name for p in tree.iterdir()]
        assert sorted(p.name for p in (tree / algo / "checkpoints").iterdir()) == ["epoch-algo-1", "epoch-algo-2"]
    _wait_clean(c, name)
