"""``hora job manifest``: a job spec as Kubernetes objects, so the same SageMaker script-mode job runs on a cluster.

The objects (docs/jobs.md, "On Kubernetes: manifests"):

- a **Secret** ``<name>-secret`` with the job's secret (32 random bytes in hex, drawn here), which every pod gets as
  ``HORA_SECRET`` and every connection between ranks proves it knows;
- a **ConfigMap** ``<name>-contract`` with the contract files: ``hyperparameters.json`` and ``inputdataconfig.json``
  as SageMaker writes them, ``resourceconfig-algo-K.json`` for each host, and ``job.json`` (the spec as the pods
  read it); and, unless the code is built into the image, a ConfigMap ``<name>-code`` with the source directory;
- a headless **Service** ``<name>`` that gives each pod a DNS name, ``<name>-<index>.<name>``;
- an **Indexed Job** ``<name>``: ``instance_count`` pods at once, pod ``index`` is host ``algo-(index+1)``; each runs
  :mod:`hora.jobs.k8s_entry`, which lays out ``/opt/ml`` from the ConfigMaps and starts that host's ranks.

Everything in the contract comes from the functions that build it for a local job (:mod:`hora.jobs.sagemaker_env`);
what cannot travel in a manifest (a path on this machine as a channel or a checkpoint path, an output path without
a volume) is refused with a :class:`SpecError` that names the field and the fix.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora.errors import ConfigError, SpecError
from hora.jobs.cluster import host_names
from hora.jobs.sagemaker_env import (
    HostLayout,
    encode_hyperparameters,
    input_data_config,
    resource_config,
    sm_variables,
)
from hora.jobs.spec import JobSpec

__all__ = [
    "BASE_DIR",
    "CODE_LIMIT",
    "CODE_MOUNT",
    "CONTRACT_MOUNT",
    "INTERFACE",
    "PER_POD_VARIABLES",
    "RENDEZVOUS_PORT",
    "TORCH_PORT",
    "KubernetesOptions",
    "build_manifests",
    "dump_manifests",
    "write_manifests",
]

#: Where the pods' SageMaker tree is (as on SageMaker).
BASE_DIR = "/opt/ml"
#: Where the contract ConfigMap and the code ConfigMap are mounted.
CONTRACT_MOUNT = "/etc/hora/contract"
CODE_MOUNT = "/etc/hora/code"
#: The pods' private work directory (an emptyDir): the wrappers' plan, logs and records.
WORK_MOUNT = "/var/hora"
#: The port algo-1's pod serves hora's rendezvous on (torchrun's c10d default, unused by hora otherwise).
RENDEZVOUS_PORT = 29400
#: torch.distributed's MASTER_PORT (hora itself does not use it).
TORCH_PORT = 29500
#: A pod's network interface, as SageMaker's containers name it.
INTERFACE = "eth0"
#: The most bytes of source a ConfigMap carries here (Kubernetes allows 1 MiB per object, base64 and keys
#: included); a larger source directory belongs in the image.
CODE_LIMIT = 512 * 1024
#: The SM_* variables that differ from pod to pod: the entry point sets them in each pod, the manifest does not.
PER_POD_VARIABLES = ("SM_CURRENT_HOST", "SM_RESOURCE_CONFIG", "SM_TRAINING_ENV", "SM_NUM_CPUS", "SM_NUM_GPUS")
_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label: a Service name, a pod's host name
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_SKIPPED = ("__pycache__", ".git")


@dataclass(frozen=True)
class KubernetesOptions:
    """What the manifests need beyond the spec: the image, where the objects go, the pods' resources.

    ``name`` is the Job's (and the Service's) name, default: the spec's ``job_name`` made a DNS label.
    ``code_in_image``: the image holds the source directory at ``/opt/ml/code`` (no code ConfigMap).
    ``output_claim``: a PersistentVolumeClaim mounted at a local ``output_path`` in every pod.
    ``cpu``, ``memory``: requests and limits (Kubernetes quantities, e.g. ``4``, ``500m``, ``16Gi``); ``gpus``:
    ``nvidia.com/gpu`` per pod.
    """

    image: str
    name: str | None = None
    namespace: str | None = None
    code_in_image: bool = False
    output_claim: str | None = None
    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0
    python: str = "python3"
    secret: str | None = None  # hex; drawn fresh when None


def _default_name(job_name: str, longest_suffix: int) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"hora-{name}".rstrip("-")
    return name[: 63 - longest_suffix].rstrip("-")


def _check(spec: JobSpec, options: KubernetesOptions) -> tuple[str, list[str]]:
    """The objects' name, or SpecError listing everything a manifest cannot carry."""
    problems: list[str] = []
    suffix = len(f"-{spec.instance_count - 1}")
    name = options.name or _default_name(spec.job_name, suffix)
    if not _LABEL.match(name) or len(name) + suffix > 63:
        problems.append(f"--name {name!r} must be a DNS label of lowercase letters, digits and '-', starting with a "
                        f"letter, at most {63 - suffix} characters (pod host names are <name>-<index>)")
    if options.namespace is not None and (not _NAMESPACE.match(options.namespace) or len(options.namespace) > 63):
        problems.append(f"--namespace {options.namespace!r} is not a Kubernetes namespace name (lowercase letters, "
                        "digits and '-', at most 63)")
    if not options.image or any(c.isspace() for c in options.image):
        problems.append(f"--image {options.image!r} must name a container image, e.g. registry.example.com/train:1")
    for flag, value in (("--cpu", options.cpu), ("--memory", options.memory)):
        if value is not None and not _QUANTITY.match(value):
            problems.append(f"{flag} {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    if options.gpus < 0:
        problems.append(f"--gpus {options.gpus} must be 0 or more")
    for ch in spec.inputs:
        if not ch.is_s3:
            problems.append(f"channel {ch.name!r}: the local path {ch.uri} cannot travel in a manifest; upload it "
                            f"(aws s3 sync {ch.uri} s3://BUCKET/PREFIX) and give that s3:// URI: each pod fetches "
                            "its share itself")
    if not spec.output_path:
        problems.append("output_path is missing: on Kubernetes algo-1 writes model.tar.gz and output.tar.gz to "
                        "output_path, which must be an s3:// URI or a volume (a local path with --output-claim)")
    elif not spec.output_path.startswith("s3://") and not options.output_claim:
        problems.append(f"output_path {spec.output_path} is a path on this machine, which the pods do not have: give "
                        "an s3:// URI, or --output-claim CLAIM to mount that PersistentVolumeClaim at this path")
    if spec.checkpoint_path and not spec.checkpoint_path.startswith("s3://"):
        problems.append(f"checkpoint_path {spec.checkpoint_path} is a path on this machine: on Kubernetes give an "
                        "s3:// URI")
    if spec.strategy == "parameter_server":
        problems.append("distribution parameter_server is not supported by hora job manifest yet: use mpi / "
                        "allreduce (hora's collectives), or run the job with hora job run")
    if spec.use_spot_instances:
        problems.append("use_spot_instances: managed spot is SageMaker's and hora job run's; on Kubernetes leave it "
                        "out (a node's loss fails its pod, which the Job retries within max_retry_attempts)")
    if spec.tensorboard_output_config is not None or spec.mlflow is not None:
        problems.append("tensorboard_output_config / mlflow are exported by hora job run's supervisor, which a "
                        "Kubernetes job has not: leave them out (the scripts may write TensorBoard files to "
                        "/opt/ml/output/data, archived in output.tar.gz)")
    return name, problems


def _code_files(source_dir: str) -> tuple[list[tuple[str, Path]], list[str]]:
    """The source directory's files (relative path, path), or the problems that keep it out of a ConfigMap."""
    files: list[tuple[str, Path]] = []
    problems: list[str] = []
    total = 0
    for root, dirs, names in os.walk(source_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED)
        for n in sorted(names):
            path = Path(root, n)
            rel = path.relative_to(source_dir).as_posix()
            if n.endswith(".pyc"):
                continue
            if path.is_symlink() or not path.is_file():
                problems.append(f"source_dir holds {rel}, a link or special file, which a ConfigMap cannot carry")
                continue
            total += path.stat().st_size
            files.append((rel, path))
    if total > CODE_LIMIT:
        problems.append(f"source_dir {source_dir} holds {total} bytes, more than the {CODE_LIMIT} a ConfigMap "
                        "carries here")
    if problems:
        problems = [f"{p}: build the code into the image at {BASE_DIR}/code and pass --code-in-image" for p in problems]
    return files, problems


def _meta(name: str, options: KubernetesOptions, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if options.namespace:
        meta["namespace"] = options.namespace
    return meta


def _config_map(name: str, options: KubernetesOptions, labels: dict[str, str],
                data: dict[str, str], binary: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, options, labels),
                           "data": data}
    if binary:
        out["binaryData"] = binary
    return out


def build_manifests(spec: JobSpec, options: KubernetesOptions) -> tuple[list[dict[str, Any]], list[str]]:
    """The Kubernetes objects of ``spec`` (Secret, ConfigMaps, Service, Job, in the order to apply them) and notes
    for the user (what the image must hold).

    Raises:
        SpecError: listing everything in the spec or the options that a manifest cannot carry, with the fix.
    """
    name, problems = _check(spec, options)
    files: list[tuple[str, Path]] = []
    if not options.code_in_image:
        files, code_problems = _code_files(spec.source_dir)
        problems += code_problems
    if problems:
        raise SpecError(problems, f"job {spec.job_name} on Kubernetes")
    notes = []
    if os.path.isfile(os.path.join(spec.source_dir, "requirements.txt")):
        notes.append(f"{spec.source_dir}/requirements.txt is not installed in the pods: the image must have those "
                     "packages (and hora with the jobs extra)")
    labels = {"app.kubernetes.io/managed-by": "hora", "hora-job": name}
    code_dir = f"{BASE_DIR}/code"
    pod_spec = dataclasses.replace(spec, source_dir=code_dir, network="auto")
    hosts = host_names(spec.instance_count)
    raw_hps = encode_hyperparameters(pod_spec)
    data_config = input_data_config(pod_spec)
    contract = {
        "job.json": json.dumps(pod_spec.to_dict(), indent=1),
        "hyperparameters.json": json.dumps(raw_hps, indent=2) + "\n",
        "inputdataconfig.json": json.dumps(data_config, indent=2) + "\n",
    }
    for host in hosts:
        resource = resource_config(pod_spec, host, INTERFACE)
        contract[f"resourceconfig-{host}.json"] = json.dumps(resource, indent=2) + "\n"
    secret_hex = options.secret or secrets.token_hex(32)
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1", "kind": "Secret", "metadata": _meta(f"{name}-secret", options, labels),
            "type": "Opaque", "data": {"secret": base64.b64encode(secret_hex.encode()).decode()},
        },
        _config_map(f"{name}-contract", options, labels, contract),
    ]
    volumes: list[dict[str, Any]] = [{"name": "contract", "configMap": {"name": f"{name}-contract"}}]
    mounts: list[dict[str, Any]] = [{"name": "contract", "mountPath": CONTRACT_MOUNT, "readOnly": True}]
    if files:
        data: dict[str, str] = {}
        binary: dict[str, str] = {}
        items = []
        for i, (rel, path) in enumerate(files):
            key = f"f{i}-{re.sub(r'[^-._a-zA-Z0-9]', '_', path.name)}"[:253]
            raw = path.read_bytes()
            try:
                data[key] = raw.decode()
            except UnicodeDecodeError:
                binary[key] = base64.b64encode(raw).decode()
            executable = os.access(path, os.X_OK)
            items.append({"key": key, "path": rel, "mode": 0o755 if executable else 0o644})
        objects.append(_config_map(f"{name}-code", options, labels, data, binary))
        volumes.append({"name": "code", "configMap": {"name": f"{name}-code", "items": items}})
        mounts.append({"name": "code", "mountPath": CODE_MOUNT, "readOnly": True})
    for part in ("input", "model", "output", "checkpoints", *(("code",) if files else ())):
        volumes.append({"name": f"opt-ml-{part}", "emptyDir": {}})
        mounts.append({"name": f"opt-ml-{part}", "mountPath": f"{BASE_DIR}/{part}"})
    volumes.append({"name": "work", "emptyDir": {}})
    mounts.append({"name": "work", "mountPath": WORK_MOUNT})
    if options.output_claim and spec.output_path and not spec.output_path.startswith("s3://"):
        volumes.append({"name": "output-path", "persistentVolumeClaim": {"claimName": options.output_claim}})
        mounts.append({"name": "output-path", "mountPath": spec.output_path})

    # The job-wide SM_* variables, from the same function as a local host's; the per-pod ones come from the entry.
    sm = sm_variables(pod_spec, HostLayout(Path(BASE_DIR)), hosts[0], 0, 0, raw_hps,
                      resource_config(pod_spec, hosts[0], INTERFACE), data_config)
    env_values = {k: v for k, v in sm.items() if k not in PER_POD_VARIABLES}
    env_values.update(spec.environment)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env_values.items()]
    env.append({"name": "HORA_SECRET", "valueFrom": {"secretKeyRef": {"name": f"{name}-secret", "key": "secret"}}})
    command = [options.python, "-m", "hora.jobs.k8s_entry", "--contract", CONTRACT_MOUNT, "--base", BASE_DIR,
               "--workdir", WORK_MOUNT, "--peer-dns", f"{name}-{{index}}.{name}", "--interface", INTERFACE,
               "--rendezvous-port", str(RENDEZVOUS_PORT), "--torch-port", str(TORCH_PORT)]
    if files:
        command += ["--code", CODE_MOUNT]
    container: dict[str, Any] = {
        "name": "algo",
        "image": options.image,
        "command": command,
        "env": env,
        "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},
                  {"name": "torch", "containerPort": TORCH_PORT}],
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(options)
    if resources:
        container["resources"] = resources
    objects.append({
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(name, options, labels),
        "spec": {
            "clusterIP": "None",  # headless: a DNS record per pod, no load balancing
            "publishNotReadyAddresses": True,  # the pods look each other up before any is Ready
            "selector": {"hora-job": name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    })
    objects.append({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, options, labels),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.instance_count,
            "parallelism": spec.instance_count,
            # every pod of a failed attempt fails (a lost peer ends the others' ranks): each retry costs N pods
            "backoffLimit": spec.max_retry_attempts * spec.instance_count,
            "activeDeadlineSeconds": max(1, math.ceil(spec.max_run)),
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "subdomain": name,  # with the Service: <name>-<index>.<name> resolves to each pod
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": math.ceil(spec.stop_grace) + 10,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    })
    return objects, notes


def _resources(options: KubernetesOptions) -> dict[str, Any]:
    amounts: dict[str, Any] = {}
    if options.cpu:
        amounts["cpu"] = options.cpu
    if options.memory:
        amounts["memory"] = options.memory
    if options.gpus:
        amounts["nvidia.com/gpu"] = options.gpus
    if not amounts:
        return {}
    requests = {k: v for k, v in amounts.items() if k != "nvidia.com/gpu"}
    return {"limits": amounts, **({"requests": requests} if requests else {})}


def dump_manifests(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML text (``kubectl apply -f`` takes it)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        # the contract files and the code read as files: multi-line strings as literal blocks
        style = "|" if "\n" in value and not any(line.endswith(" ") for line in value.splitlines()) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, text)
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def write_manifests(objects: list[dict[str, Any]], out: str | os.PathLike[str]) -> list[Path]:
    """Write the objects to ``out``: a directory (an existing one, or a path ending in ``/``) gets one file per
    object, ``NN-kind-name.yaml`` in the order to apply them; anything else is one multi-document file. Files are
    0600: they hold the job's secret.

    Raises:
        ConfigError: the destination cannot be written.
    """
    from hora.jobs.store import write_private

    target = Path(out)
    try:
        if target.is_dir() or str(out).endswith(os.sep):
            written = []
            for i, obj in enumerate(objects):
                path = target / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
                write_private(path, dump_manifests([obj]))
                written.append(path)
            return written
        write_private(target, dump_manifests(objects))
    except OSError as exc:
        raise ConfigError(f"cannot write the manifests to {target}: {exc.strerror or exc}") from None
    return [target]
