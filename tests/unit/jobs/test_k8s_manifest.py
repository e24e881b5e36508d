"""``hora job manifest``: the objects validate against the Kubernetes API schema (kubernetes-validate's official JSON
schemas, strict), a wrong field is rejected by the same check, the contract is the local jobs' own, and what cannot
travel in a manifest is refused with the fix."""

from __future__ import annotations

import base64
import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (the test extra)")
pytest.importorskip("yaml", reason="job specs need PyYAML (the jobs extra)")

import yaml  # noqa: E402

from hora.cli import main  # noqa: E402
from hora.errors import SpecError  # noqa: E402
from hora.jobs import parse_spec  # noqa: E402
from hora.jobs.k8s_manifest import CODE_LIMIT, KubernetesOptions, build_manifests, dump_manifests  # noqa: E402
from hora.jobs.sagemaker_env import HostLayout, write_host_config  # noqa: E402
from hora.jobs.spec import spec_from_dict  # noqa: E402

#: The oldest Kubernetes the manifests are meant for (Indexed Jobs with pod host names are GA from 1.24) and the
#: newest schema the package ships.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "lib" / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "lib" / "util.py").write_text("X = 1\n")
    (src / "lib" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "table.bin").write_bytes(bytes(range(256)))
    return src


def _spec(tmp_path: Path, **fields: Any):
    data = {
        "entry_point": "train.py", "source_dir": str(_src(tmp_path)), "job_name": "Mnist-Run", "instance_count": 3,
        "distribution": {"mpi": {"enabled": True, "processes_per_host": 2}},
        "hyperparameters": {"epochs": 3, "optimizer": "adam"}, "inputs": {"train": "s3://bucket/train/"},
        "output_path": "s3://bucket/out", "max_retry_attempts": 2, "max_run": 100.5,
        "environment": {"AWS_REGION": "eu-west-1"},
    }  # fmt: skip
    data.update(fields)
    return parse_spec(data)


def _objects(tmp_path: Path, **options: Any) -> dict[str, dict[str, Any]]:
    objects, _ = build_manifests(_spec(tmp_path), KubernetesOptions(image="example/train:1", **options))
    return {o["kind"] + ("-code" if o["metadata"]["name"].endswith("-code") else ""): o for o in objects}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_against_the_kubernetes_api_schema(tmp_path, version):
    objects, _ = build_manifests(_spec(tmp_path), KubernetesOptions(
        image="example/train:1", namespace="ml", cpu="2", memory="8Gi", gpus=1))
    text = dump_manifests(objects)
    loaded = list(yaml.safe_load_all(text))
    assert [o["kind"] for o in loaded] == ["Secret", "ConfigMap", "ConfigMap", "Service", "Job"]
    for obj in loaded:  # what kubectl apply -f reads back from the YAML
        kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["namespace"] == "ml"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda job: job["spec"]["template"]["spec"]["containers"][0].update(comand=["python3"]),  # misspelled
        lambda job: job["spec"].update(completions="three"),  # wrong type
        lambda job: job["spec"]["template"]["spec"]["containers"][0].pop("name"),  # a required field missing
        lambda job: job["spec"]["template"]["spec"]["volumes"][0].update(configMap={"name": 7}),
    ],
    ids=["unknown-field", "wrong-type", "missing-required", "wrong-nested-type"],
)
def test_the_schema_check_rejects_a_wrong_field(tmp_path, mutate):
    job = _objects(tmp_path)["Job"]
    kubernetes_validate.validate(job, VERSIONS[0], strict=True)
    broken = copy.deepcopy(job)
    mutate(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_the_job_runs_every_host_at_once_with_the_specs_limits(tmp_path):
    objs = _objects(tmp_path, cpu="500m", memory="2Gi", gpus=2)
    job, service, secret = objs["Job"], objs["Service"], objs["Secret"]
    name = job["metadata"]["name"]
    assert name == service["metadata"]["name"] == "mnist-run"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 2 * 3  # each retry of the job costs one pod per host
    assert spec["activeDeadlineSeconds"] == 101
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    container = pod["containers"][0]
    assert container["resources"] == {"limits": {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": 2},
                                      "requests": {"cpu": "500m", "memory": "2Gi"}}
    assert container["command"][container["command"].index("--peer-dns") + 1] == f"{name}-{{index}}.{name}"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2", "algo-3"]
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth0" and env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert json.loads(env["SM_HPS"]) == {"epochs": 3, "optimizer": "adam"}
    assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train" and env["AWS_REGION"] == "eu-west-1"
    assert not {"SM_CURRENT_HOST", "SM_TRAINING_ENV", "SM_NUM_CPUS"} & set(env)  # the entry sets them per pod
    ref = env["HORA_SECRET"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"]
    assert len(bytes.fromhex(base64.b64decode(secret["data"][ref["key"]]).decode())) == 32


def test_the_contract_files_are_the_ones_a_local_host_gets(tmp_path):
    contract = _objects(tmp_path)["ConfigMap"]["data"]
    pod_spec = spec_from_dict(json.loads(contract["job.json"]))
    assert pod_spec.source_dir == "/opt/ml/code" and pod_spec.instance_count == 3
    layout = HostLayout(tmp_path / "local")
    write_host_config(pod_spec, layout, "algo-2", "eth0")
    assert contract["resourceconfig-algo-2.json"] == (layout.config_dir / "resourceconfig.json").read_text()
    assert contract["hyperparameters.json"] == (layout.config_dir / "hyperparameters.json").read_text()
    assert contract["inputdataconfig.json"] == (layout.config_dir / "inputdataconfig.json").read_text()


def test_the_code_config_map_carries_the_source_dir_and_the_image_can_hold_it_instead(tmp_path):
    objs = _objects(tmp_path)
    code = objs["ConfigMap-code"]
    volume = next(v for v in objs["Job"]["spec"]["template"]["spec"]["volumes"] if v["name"] == "code")
    items = {i["path"]: i for i in volume["configMap"]["items"]}
    assert set(items) == {"train.py", "lib/util.py", "run.sh", "table.bin"}  # no __pycache__
    assert code["data"][items["lib/util.py"]["key"]] == "X = 1\n"
    assert base64.b64decode(code["binaryData"][items["table.bin"]["key"]]) == bytes(range(256))
    assert items["run.sh"]["mode"] == 0o755 and items["train.py"]["mode"] == 0o644

    in_image = _objects(tmp_path / "b", code_in_image=True)
    assert "ConfigMap-code" not in in_image
    command = in_image["Job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--code" not in command


def test_what_cannot_travel_in_a_manifest_is_refused_with_the_fix(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    spec = _spec(tmp_path, inputs={"train": str(data)}, output_path=None, checkpoint_path=str(tmp_path / "ck"),
                 distribution={"parameter_server": {"enabled": True}})
    with pytest.raises(SpecError) as info:
        build_manifests(spec, KubernetesOptions(image="example/train:1", name="Bad_Name", cpu="two"))
    text = str(info.value)
    for expected in (f"channel 'train': the local path {data}", "give that s3:// URI", "output_path is missing",
                     f"checkpoint_path {tmp_path / 'ck'}", "parameter_server is not supported", "--name 'Bad_Name'",
                     "--cpu 'two' is not a Kubernetes quantity"):
        assert expected in text, text
    local_out = _spec(tmp_path / "c", output_path=str(tmp_path / "models"))
    with pytest.raises(SpecError, match="--output-claim CLAIM"):
        build_manifests(local_out, KubernetesOptions(image="example/train:1"))
    objects, _ = build_manifests(local_out, KubernetesOptions(image="example/train:1", output_claim="models"))
    pod = objects[-1]["spec"]["template"]["spec"]
    assert {"name": "output-path", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]
    assert {"name": "output-path", "mountPath": str(tmp_path / "models")} in pod["containers"][0]["volumeMounts"]


def test_a_source_dir_too_large_for_a_config_map_must_be_in_the_image(tmp_path):
    spec = _spec(tmp_path)
    Path(spec.source_dir, "big.bin").write_bytes(os.urandom(CODE_LIMIT + 1))
    with pytest.raises(SpecError, match="--code-in-image"):
        build_manifests(spec, KubernetesOptions(image="example/train:1"))
    build_manifests(spec, KubernetesOptions(image="example/train:1", code_in_image=True))


def test_the_cli_writes_a_file_per_object_readable_by_its_owner_only(tmp_path, capsys):
    src = _src(tmp_path)
    spec_file = src / "job.yaml"
    spec_file.write_text("entry_point: train.py\ninstance_count: 2\noutput_path: s3://bucket/out\n"
                         "job_name: cli-job\n")
    assert main(["job", "manifest", str(spec_file), "--image", "example/train:1", "-o", f"{tmp_path}/out/"]) == 0
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["00-secret-cli-job-secret.yaml", "01-configmap-cli-job-contract.yaml",
                     "02-configmap-cli-job-code.yaml", "03-service-cli-job.yaml", "04-job-cli-job.yaml"]
    for name in files:
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o600
        for obj in yaml.safe_load_all((tmp_path / "out" / name).read_text()):
            kubernetes_validate.validate(obj, VERSIONS[0], strict=True)
    assert "kubectl apply -f" in capsys.readouterr().out
    (tmp_path / "data").mkdir()
    spec_file.write_text(f"entry_point: train.py\ninputs: {{train: {tmp_path / 'data'}}}\n")
    assert main(["job", "manifest", str(spec_file), "--image", "example/train:1"]) == 2
    err = capsys.readouterr().err
    assert "on Kubernetes has 2 problems" in err and "channel 'train'" in err and "output_path is missing" in err
