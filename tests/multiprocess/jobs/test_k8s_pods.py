"""The pods of ``hora job manifest``'s Indexed Job, simulated on this machine: the manifest's own command run once per
pod as a separate process, with what Kubernetes would give it (``JOB_COMPLETION_INDEX``, ``HOSTNAME``, the
ConfigMaps' files in a directory, the Secret as ``HORA_SECRET``, the pods' DNS names standing for 127.0.0.1K), so
the entry point really forms one hora job across the pods, SageMaker's toolkit sees the hosts, and algo-1 archives
the model where output_path says."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sagemaker_training", reason="the toolkit check needs sagemaker-training (the test extra)")
pytest.importorskip("yaml", reason="job specs need PyYAML (the jobs extra)")

from hora.jobs import parse_spec
from hora.jobs.k8s_manifest import KubernetesOptions, build_manifests
from support.s3_server import CREDENTIALS, moto_server

SRC = Path(__file__).resolve().parents[3] / "src"
TIMEOUT = 120

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import hora.numpy as hvd
    from sagemaker_training import environment

    fail = os.environ.get("FAIL_RANK")
    hvd.init()
    env = environment.Environment()
    if fail is not None and hvd.rank() == int(fail):
        raise SystemExit("rank " + fail + " gives up on purpose")
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    if os.environ.get("HANG"):  # until the pod is deleted
        open(os.path.join(env.hyperparameters["out"], f"ready-{hvd.rank()}"), "w").close()
        time.sleep(300)
    seen = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "sum": float(total[0]),
            "hosts": env.hosts, "current_host": env.current_host, "sm_current_host": os.environ["SM_CURRENT_HOST"],
            "hps": env.hyperparameters, "model_dir": env.model_dir,
            "train": sorted(os.listdir(env.channel_input_dirs["train"])) if env.channel_input_dirs else None}
    with open(os.path.join(env.hyperparameters["out"], f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(seen, f)
    if env.is_master and hvd.local_rank() == 0:
        with open(os.path.join(env.model_dir, "weights.txt"), "w") as f:
            f.write("trained")
    print("done rank", hvd.rank(), flush=True)
    hvd.shutdown()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mount(config_map: dict[str, Any], directory: Path, items: list[dict[str, Any]] | None = None) -> None:
    """A ConfigMap volume as the kubelet lays it out: every key (or every item's path) a file."""
    files = {k: v.encode() for k, v in config_map.get("data", {}).items()}
    files.update({k: base64.b64decode(v) for k, v in config_map.get("binaryData", {}).items()})
    for item in items or [{"key": k, "path": k, "mode": 0o644} for k in files]:
        path = directory / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[item["key"]])
        path.chmod(item["mode"])


def _pods(tmp_path: Path, objects: list[dict[str, Any]], only: int | None = None,
          peer_dns: str = "127.0.0.1{index}") -> list[subprocess.Popen[bytes]]:
    """Start one process per pod of the manifest's Job (or only pod ``only``), each with its index, mounts and
    variables; ``peer_dns`` stands for the pods' DNS names (127.0.0.10, 127.0.0.11, ... on lo)."""
    kinds = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    job = next(o for o in objects if o["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            where = tmp_path / "mounts" / mount["name"]
            _mount(kinds["ConfigMap", volume["configMap"]["name"]], where, volume["configMap"].get("items"))
            mounted[mount["mountPath"]] = where
    secret_ref = next(e for e in container["env"] if "valueFrom" in e)["valueFrom"]["secretKeyRef"]
    secret = base64.b64decode(kinds["Secret", secret_ref["name"]]["data"][secret_ref["key"]]).decode()
    env_base = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    ports = {"--rendezvous-port": str(_free_port()), "--torch-port": str(_free_port())}
    procs = []
    for index in range(job["spec"]["completions"]):
        if only is not None and index != only:
            continue
        root = tmp_path / f"pod-{index}"
        (root / "etc").mkdir(parents=True)
        (root / "etc" / "hosts").write_text("127.0.0.1\tlocalhost\n")
        replace = {**{k: str(v) for k, v in mounted.items()}, "/opt/ml": str(root / "opt-ml"),
                   "/var/hora": str(root / "work")}
        command = [sys.executable if container["command"][0] == "python3" else container["command"][0]]
        args = container["command"][1:]
        for i, arg in enumerate(args):
            if args[i - 1] in ports:
                arg = ports[args[i - 1]]
            elif args[i - 1] == "--peer-dns":
                arg = peer_dns
            command.append(replace.get(arg, arg))
        command += ["--hosts-file", str(root / "etc" / "hosts"), "--termination-log", str(root / "termination-log")]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC), **env_base, "HORA_SECRET": secret,
               "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{job['metadata']['name']}-{index}"}
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs


def _start(tmp_path: Path, environment: dict[str, str], fields: dict[str, Any] | None = None,
           **pods: Any) -> tuple[list[subprocess.Popen[bytes]], Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(SCRIPT)
    (src / "lib").mkdir()
    (src / "lib" / "blob.bin").write_bytes(bytes(range(256)))  # binaryData in the code ConfigMap
    out, artifacts = tmp_path / "out", tmp_path / "artifacts"
    out.mkdir(exist_ok=True)
    spec = parse_spec({
        "entry_point": "train.py", "source_dir": str(src), "job_name": "k8s-sim", "instance_count": 2,
        "distribution": {"mpi": {"enabled": True, "processes_per_host": 2}},
        "hyperparameters": {"out": str(out), "epochs": 2}, "output_path": str(artifacts),
        "master_timeout": 60 if not pods else 2,
        "environment": environment, **(fields or {}),
    })  # fmt: skip
    objects, _ = build_manifests(spec, KubernetesOptions(image="example/train:1", output_claim="artifacts"))
    return _pods(tmp_path, objects, **pods), out


def _run(tmp_path: Path, fail_rank: int | None = None, environment: dict[str, str] | None = None,
         **pods: Any) -> tuple[list[int], list[str], Path, Path]:
    env = {**(environment or {}), **({"FAIL_RANK": str(fail_rank)} if fail_rank is not None else {})}
    procs, out = _start(tmp_path, env, pods.pop("fields", None), **pods)
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT)[0].decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [p.returncode for p in procs], outputs, out, tmp_path / "artifacts" / "k8s-sim" / "output"


def test_the_pods_form_one_job_the_toolkit_sees_the_hosts_and_algo_1_archives_the_model(tmp_path):
    codes, outputs, out, artifacts = _run(tmp_path)
    assert codes == [0, 0], outputs
    for rank in range(4):
        seen = json.loads((out / f"rank-{rank}.json").read_text())
        host = f"algo-{rank // 2 + 1}"
        assert seen["size"] == 4 and seen["local_rank"] == rank % 2
        assert seen["sum"] == 1 + 2 + 3 + 4  # an allreduce across both pods
        assert seen["hosts"] == ["algo-1", "algo-2"]
        assert seen["current_host"] == seen["sm_current_host"] == host
        assert seen["hps"] == {"out": str(out), "epochs": 2}
        assert seen["model_dir"] == str(tmp_path / f"pod-{rank // 2}" / "opt-ml" / "model")
    assert "[algo-2 rank 3] done rank 3" in outputs[1]
    for index in range(2):  # the SM_HOSTS names resolve in each pod through its hosts file
        assert "127.0.0.10\talgo-1\n127.0.0.11\talgo-2\n" in (tmp_path / f"pod-{index}" / "etc" / "hosts").read_text()
        assert (tmp_path / f"pod-{index}" / "opt-ml" / "code" / "lib" / "blob.bin").read_bytes() == bytes(range(256))
    with tarfile.open(artifacts / "model.tar.gz") as tar:
        assert tar.extractfile("weights.txt").read() == b"trained"  # type: ignore[union-attr]
    assert (artifacts / "output.tar.gz").is_file()


def test_a_failing_rank_fails_both_pods_and_algo_1_says_why_in_its_termination_message(tmp_path):
    codes, outputs, _, _ = _run(tmp_path, fail_rank=2)  # a rank of algo-2
    assert codes[1] == 1 and codes[0] != 0, outputs
    reason = (tmp_path / "pod-1" / "termination-log").read_text()
    assert "host algo-2, rank 2" in reason and "gives up on purpose" in reason, reason
    assert (tmp_path / "pod-0" / "termination-log").is_file()  # algo-1's ranks lost their peer


def test_a_pod_whose_peers_never_resolve_ends_naming_them(tmp_path):
    codes, outputs, _, _ = _run(tmp_path, only=0, peer_dns="hora-k8s-test-{index}.invalid")
    assert codes == [2], outputs
    message = (tmp_path / "pod-0" / "termination-log").read_text()
    assert "waited 2s for the pods of the job to get their DNS names" in message, message
    assert "algo-1 (hora-k8s-test-0.invalid" in message and "algo-2 (hora-k8s-test-1.invalid" in message, message


def test_a_pod_whose_algo_1_never_serves_ends_naming_it(tmp_path):
    codes, outputs, _, _ = _run(tmp_path, only=1)  # algo-2 alone: nobody serves the rendezvous
    assert codes == [2], outputs
    message = (tmp_path / "pod-1" / "termination-log").read_text()
    assert "algo-2 waited 2s for algo-1 to serve the rendezvous at 127.0.0.10:" in message, message


def test_a_sigterm_to_the_pods_stops_every_rank_and_leaves_nothing_running(tmp_path):
    procs, out = _start(tmp_path, {"HANG": "1"})
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(list(out.glob("ready-*"))) < 4:  # every rank is in its script, after an allreduce
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
                p.communicate()[0] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        for proc in procs:  # what the kubelet does on kubectl delete or activeDeadlineSeconds
            proc.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=TIMEOUT)[0].decode(errors="replace") for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * 2, outputs
    assert "killed by SIGTERM" in (tmp_path / "pod-0" / "termination-log").read_text()
    assert (tmp_path / "artifacts" / "k8s-sim" / "output" / "model.tar.gz").is_file()  # archived after a stop too
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(tmp_path))]
    assert left == []


def _mentions(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def test_each_pod_fetches_its_share_of_an_s3_channel_and_algo_1_uploads_the_model_to_s3(tmp_path):
    boto3 = pytest.importorskip("boto3", reason="S3 channels need boto3 (the jobs extra)")
    pytest.importorskip("moto.server", reason="the S3 check needs moto[server] (the test extra)")
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="data")
        for i in range(4):
            client.put_object(Bucket="data", Key=f"train/part-{i}.csv", Body=b"%d\n" % i)
        codes, outputs, out, _ = _run(
            tmp_path, environment={**CREDENTIALS, "HORA_S3_ENDPOINT_URL": endpoint},
            fields={"inputs": {"train": {"uri": "s3://data/train/", "distribution": "ShardedByS3Key"}},
                    "output_path": "s3://data/jobs"},
        )
        assert codes == [0, 0], outputs
        for rank in range(4):  # ShardedByS3Key: algo-1 the 1st and 3rd object, algo-2 the others
            seen = json.loads((out / f"rank-{rank}.json").read_text())
            assert seen["train"] == (["part-0.csv", "part-2.csv"] if rank < 2 else ["part-1.csv", "part-3.csv"])
        body = client.get_object(Bucket="data", Key="jobs/k8s-sim/output/model.tar.gz")["Body"].read()
    (tmp_path / "model.tar.gz").write_bytes(body)
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        assert tar.extractfile("weights.txt").read() == b"trained"  # type: ignore[union-attr]


@pytest.mark.parametrize(("index", "expected"), [
    (None, "JOB_COMPLETION_INDEX=None is not a pod index"),
    ("0", "is not a job that hora job manifest wrote"),  # no contract mounted
])
def test_an_entry_point_started_outside_the_manifests_pods_says_what_is_missing(tmp_path, index, expected):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC), **({"JOB_COMPLETION_INDEX": index} if index else {})}
    proc = subprocess.run(
        [sys.executable, "-m", "hora.jobs.k8s_entry", "--contract", str(tmp_path / "none"), "--workdir",
         str(tmp_path / "work"), "--peer-dns", "127.0.0.1{index}", "--termination-log", str(tmp_path / "log")],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert expected in (tmp_path / "log").read_text()
