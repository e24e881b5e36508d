"""``hora job`` on a Ray cluster (the spec's ``cluster: {ray: ADDRESS}``, ``hora job run --ray``): 2-host jobs, one host
algo-K per node, on a local Ray cluster (Ray's cluster_utils, 2 CPUs per node, one start for the whole module), reached
through the hosts' command agents. The cluster has a third node, so that the test that loses a node leaves two for
the others, whatever their order. Each host keeps its job directory under a directory of its own (``work_dir`` with
``{host}``), so the shared file system cannot hide a tree that was not shipped."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("sagemaker_training", reason="the toolkit check needs sagemaker-training (the test extra)")
yaml = pytest.importorskip("yaml", reason="the spec file needs PyYAML (the jobs extra)")

from hora.cli import main  # noqa: E402 - after the skips
from hora.jobs import JobStore, parse_spec, start_job  # noqa: E402
from support.ray_cluster import local_cluster, settle  # noqa: E402

LIMIT = 240.0

SCRIPT = textwrap.dedent("""
    import json, os, socket, sys, time
    import numpy as np
    import hora.numpy as hvd
    from sagemaker_training import environment
    from hora.data import PipeDataset

    hvd.init()
    if os.environ.get("SM_HP_SLEEP"):
        print(f"ready {hvd.rank()}", flush=True)
        time.sleep(600)
    streamed = list(PipeDataset("stream")) if hvd.local_rank() == 0 else None  # one reader per FIFO
    env = environment.Environment()
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    seen = {"hosts": env.hosts, "current_host": env.current_host, "sm_current": os.environ["SM_CURRENT_HOST"],
            "model_dir": env.model_dir, "allreduce": float(total[0]), "streamed": streamed,
            "data": open(os.path.join(os.environ["SM_CHANNEL_TRAINING"], "a.txt")).read(),
            "names": [socket.gethostbyname(h) for h in env.hosts], "hostname": socket.gethostname()}
    with open(os.path.join(env.model_dir, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(seen, f)
    print(f"loss={0.5 + hvd.rank()}", flush=True)
""")


@pytest.fixture(scope="module")
def ray_cluster():
    mp = pytest.MonkeyPatch()
    try:
        with local_cluster(mp, nodes=3, num_cpus=2) as cluster:
            yield cluster
    finally:
        mp.undo()


def _spec(cluster, tmp_path: Path, name: str, **extra: object) -> dict[str, object]:
    src, data, stream = tmp_path / "src", tmp_path / "data", tmp_path / "stream"
    for d in (src, data, stream):
        d.mkdir(exist_ok=True)
    (src / "train.py").write_text(SCRIPT)
    (data / "a.txt").write_text("channel data")
    (stream / "a.txt").write_text("one\ntwo\n")
    return {
        "entry_point": "train.py", "source_dir": str(src), "job_name": name, "instance_count": 2,
        "processes_per_host": 2, "distribution": {"mpi": {"enabled": True}},
        "inputs": {"training": str(data), "stream": {"uri": str(stream), "input_mode": "Pipe"}},
        "metric_definitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}], "stop_grace": 5,
        "cluster": {"ray": cluster.address, "work_dir": str(tmp_path / "remote-{host}")}, **extra,
    }  # fmt: skip


def _processes_in(directory: Path) -> list[str]:
    """Processes whose command line or working directory is under ``directory`` (the job's, on its nodes)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes()
                where = cmd + os.fsencode(os.readlink(entry / "cwd"))
            except OSError:
                continue
            if os.fsencode(str(directory)) in where:
                shown = cmd.replace(bytes(1), b" ")[:300]
                out.append(f"{entry.name}: {shown!r}")
    return out


def _hosts(job_dir: Path) -> dict[str, dict[str, object]]:
    return json.loads((job_dir / "hora" / "ray-hosts.json").read_text())["hosts"]


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_two_ray_nodes_run_the_contract_and_archive_home(ray_cluster, tmp_path):
    store = JobStore(tmp_path / "home")
    name = f"ray-{uuid.uuid4().hex[:6]}"
    record = start_job(parse_spec(_spec(ray_cluster, tmp_path, name,
                                        profiler_config={"system_monitor_interval_millis": 200})),
                       store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    job_dir = Path(record.job_dir)
    hosts = _hosts(job_dir)
    assert len(hosts) == 2 and len({h["node_id"] for h in hosts.values()}) == 2  # one host per node
    job_log = (job_dir / "logs" / "job.log").read_text()
    for i, (host, where) in enumerate(hosts.items()):
        assert host == f"ray-{str(where['node_id'])[:12]}"
        assert f"algo-{i + 1} on Ray node {where['address']} (" in job_log
        # every host got its own tree, in its own directory (never the other host's)
        tree = tmp_path / f"remote-{host}" / name / "hosts"
        assert (tree / f"algo-{i + 1}" / "code" / "train.py").is_file() and not (tree / f"algo-{2 - i}").exists()
    # the model of every rank, pulled from both nodes and archived here
    with tarfile.open(record.artifacts["model"]) as tar:
        seen = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()}  # type: ignore[arg-type]
    assert sorted(seen) == [f"rank-{r}.json" for r in range(4)]
    for r in range(4):
        got, algo = seen[f"rank-{r}.json"], f"algo-{r // 2 + 1}"
        host = list(hosts)[r // 2]
        assert got["hosts"] == ["algo-1", "algo-2"] and got["current_host"] == got["sm_current"] == algo
        assert got["model_dir"] == str(tmp_path / f"remote-{host}" / name / "hosts" / algo / "model")
        assert (got["allreduce"], got["data"]) == (10.0, "channel data")
        assert got["streamed"] == (["one", "two"] if r % 2 == 0 else None)  # fed on its node
        assert got["names"] == [hosts[h]["address"] for h in hosts] and got["hostname"] == algo  # run as root
    assert "[algo-2 rank 3]<stdout> loss=3.5" in (job_dir / "logs" / "algo-2.log").read_text()
    assert sorted(v for _, v, *_ in store.metrics(name)) == [0.5, 1.5, 2.5, 3.5]
    assert {h for h, *_ in store.iter_system_metrics(name)} == {"algo-1", "algo-2"}  # sampled on the nodes
    # the end: the agents stopped listening, the secret is gone, nothing of the job runs on the nodes
    assert all(_refused(str(h["address"]), int(h["port"])) for h in hosts.values())  # type: ignore[call-overload]
    assert not (job_dir / "hora" / "agent-secret").exists()
    assert settle(lambda: _processes_in(tmp_path), 30) == []

    # hora job clean --ray removes the work dirs on every node
    cli = [sys.executable, "-m", "hora", "job", "clean", "--ray", ray_cluster.address,
           "--work-dir", str(tmp_path / "remote-{host}")]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 0, done.stderr
    assert not any((tmp_path / f"remote-{h}").exists() for h in hosts)
    assert all(f"removed {h} (" in done.stdout for h in hosts), done.stdout


def _start_sleeping(cluster, tmp_path: Path, name: str, cli: bool = False, **extra: object) -> tuple[JobStore, Path]:
    """A detached job whose ranks say ``ready`` and sleep (started with ``hora job run SPEC --ray ADDRESS`` when
    ``cli``); returns once every rank has said it."""
    store = JobStore(tmp_path / "home")
    spec = _spec(cluster, tmp_path, name, hyperparameters={"sleep": 1}, **extra)
    spec["inputs"] = {"training": str(tmp_path / "data")}
    if cli:
        spec["cluster"] = {"work_dir": str(tmp_path / "remote-{host}")}  # the cluster from the command line
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
        assert main(["job", "--home", str(store.home), "run", str(tmp_path / "job.yaml"), "--ray",
                     cluster.address]) == 0
    else:
        start_job(parse_spec(spec), store, wait=False)
    job_dir = store.job_dir(name)
    deadline = time.monotonic() + LIMIT
    while sum(f.read_text().count("ready") for f in (job_dir / "logs").glob("algo-*.log")) < 2:
        assert not store.get(name).done, store.get(name).failure_reason
        assert time.monotonic() < deadline, (job_dir / "logs" / "job.log").read_text()
        time.sleep(0.5)
    return store, job_dir


def _ended(store: JobStore, name: str):
    deadline = time.monotonic() + LIMIT
    while not (record := store.get(name)).done:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    return record


def test_a_node_removed_mid_job_ends_it_naming_the_node(ray_cluster, tmp_path):
    name = f"lost-{uuid.uuid4().hex[:6]}"
    store, job_dir = _start_sleeping(ray_cluster, tmp_path, name, processes_per_host=1)
    used = {str(h["node_id"]): h for h in _hosts(job_dir).values()}
    doomed = next(n for n in ray_cluster.worker_nodes if n.node_id in used)  # not the head: the cluster lives on
    assert _processes_in(tmp_path) != []  # the ranks run on their nodes
    ray_cluster.remove_node(doomed)
    record = _ended(store, name)
    assert record.status == "Failed"
    where = used[doomed.node_id]
    assert f"Ray node {where['address']}, node id {doomed.node_id}" in (record.failure_reason or ""), \
        record.failure_reason
    assert settle(lambda: _processes_in(tmp_path), 60) == []


def test_hora_job_stop_stops_the_ranks_on_every_node_of_a_job_run_with_ray(ray_cluster, tmp_path):
    name = f"stop-{uuid.uuid4().hex[:6]}"
    store, _ = _start_sleeping(ray_cluster, tmp_path, name, cli=True, processes_per_host=1)
    assert store.get(name).spec["cluster"]["address"] == ray_cluster.address  # --ray
    assert _processes_in(tmp_path) != []  # the ranks run on their nodes
    assert main(["job", "--home", str(tmp_path / "home"), "stop", name]) == 0
    record = _ended(store, name)
    assert record.status == "Stopped", record.failure_reason
    assert settle(lambda: _processes_in(tmp_path), 60) == []


def test_a_job_wider_than_the_cluster_fails_at_once_saying_what_it_has(ray_cluster, tmp_path):
    store = JobStore(tmp_path / "home")
    spec = parse_spec(_spec(ray_cluster, tmp_path, f"wide-{uuid.uuid4().hex[:6]}", instance_count=4))
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert "for 4 node(s) with 2 CPUs each (one host algo-K per node); the cluster has " in reason, reason
    assert re.search(r"the cluster has [23] such node\(s\) \(its nodes: \S+ with 2 CPUs; ", reason), reason
    assert not (Path(record.job_dir) / "hora" / "ray-hosts.json").exists()  # nothing was placed
    assert "did not become free" not in reason
