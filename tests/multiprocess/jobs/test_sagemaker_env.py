"""The SageMaker script-mode contract, exactly: files, SM_* variables, their JSON encodings, the script's argv,
hora's per-host rank variables — checked from inside a real 2-host x 2-process job."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from hora.jobs import JobStore, parse_spec, start_job
from hora.jobs.sagemaker_env import to_cmd_args
from support import paths

HPS = {"epochs": 3, "lr": 0.1, "name": "adam", "flag": True, "off": False, "layers": [1, 2],
       "opts": {"b": 2, "a": "x"}, "n": 5, "empty": None}

DUMP = textwrap.dedent("""
    import json, os, socket, sys
    import numpy as np
    import hora.numpy as hvd
    from hora._runtime import context

    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum, name="ranks")
    keep = ("SM_", "HORA_", "HOROVOD_")
    out = {
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(keep) and k != "HORA_SECRET"},
        "torchrun": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")},
        "peer_addresses": [p.addr for p in context.current().peers],
        "transport": context.current().transport,
        "topology": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
        "sum": float(total[0]),
        "resolved": {h: socket.gethostbyname(h) for h in json.loads(os.environ["SM_HOSTS"])} if os.geteuid() == 0
        else None,
        "hostname": socket.gethostname(),
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "opt_ml": json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
        if os.geteuid() == 0 else None,
    }
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(out, f)
    hvd.shutdown()
""")


def test_cmd_args_encoding_is_the_toolkits():
    assert to_cmd_args(HPS) == [
        "--empty", "", "--epochs", "3", "--flag", "True", "--layers", "[1, 2]", "--lr", "0.1", "-n", "5",
        "--name", "adam", "--off", "False", "--opts", "a=x,b=2",
    ]


def _network_unavailable() -> str:
    from hora.jobs import netns

    return netns.unavailable()


@pytest.fixture(scope="module", params=["namespace", "loopback"])
def job(request, tmp_path_factory):
    """The contract job, once with a network namespace per host (as root) and once on loopback addresses."""
    network = request.param
    if network == "namespace" and _network_unavailable():
        pytest.skip(f"network namespaces: {_network_unavailable()}")
    base = tmp_path_factory.mktemp(f"contract-{network}")
    (base / "dump.py").write_text(DUMP)
    for ch in ("training", "eval"):
        (base / ch).mkdir()
        (base / ch / f"{ch}.csv").write_text("1,2\n")
    spec = parse_spec(
        {"entry_point": "dump.py", "hyperparameters": HPS, "instance_count": 2,
         "distribution": {"mpi": {"enabled": True, "processes_per_host": 2}},
         "inputs": {"training": "training", "eval": {"uri": "eval", "content_type": "text/csv"}},
         "environment": {"MY_SETTING": "on"}, "job_name": "contract-job", "network": network},
        base_dir=base,
    )
    store = JobStore(base / "home")
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    hosts = {h: store.job_dir("contract-job") / "hosts" / h for h in ("algo-1", "algo-2")}
    dumps = {}
    for rank in range(4):
        host = hosts["algo-1" if rank < 2 else "algo-2"]
        dumps[rank] = json.loads((host / "output" / "data" / f"rank-{rank}.json").read_text())
    plan = json.loads((store.job_dir("contract-job") / "hora" / "plan.json").read_text())
    return spec, hosts, dumps, plan


def test_config_files(job):
    _, hosts, _, plan = job
    for name, root in hosts.items():
        config = root / "input" / "config"
        hps = json.loads((config / "hyperparameters.json").read_text())
        assert {k: v for k, v in hps.items() if not k.startswith("sagemaker_")} == {
            "epochs": "3", "lr": "0.1", "name": '"adam"', "flag": "true", "off": "false", "layers": "[1, 2]",
            "opts": '{"b": 2, "a": "x"}', "n": "5", "empty": "null",
        }
        assert hps["sagemaker_program"] == '"dump.py"' and hps["sagemaker_mpi_enabled"] == "true"
        assert hps["sagemaker_mpi_num_of_processes_per_host"] == "2"
        assert json.loads((config / "resourceconfig.json").read_text())["current_host"] == name
        resource = json.loads((config / "resourceconfig.json").read_text())
        assert resource["hosts"] == ["algo-1", "algo-2"] and resource["network_interface_name"] == plan["interface"]
        assert json.loads((config / "inputdataconfig.json").read_text()) == {
            "training": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"},
            "eval": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None",
                     "ContentType": "text/csv"},
        }
        for d in ("input/data/training", "input/data/eval", "code", "model", "output/data", "checkpoints"):
            assert (root / d).is_dir(), d
        assert (root / "input/data/training/training.csv").read_text() == "1,2\n"
        assert (root / "code" / "dump.py").is_file()


def test_argv_and_user_args(job):
    _, _, dumps, _ = job
    for d in dumps.values():
        assert d["argv"] == to_cmd_args(HPS)
        assert json.loads(d["env"]["SM_USER_ARGS"]) == to_cmd_args(HPS)
        assert d["env"]["SM_USER_ARGS"] == json.dumps(to_cmd_args(HPS), separators=(",", ":"))


def test_sm_variables(job):
    spec, hosts, dumps, plan = job
    for rank, d in dumps.items():
        env = d["env"]
        host = "algo-1" if rank < 2 else "algo-2"
        root = hosts[host]
        assert d["cwd"] == str(root / "code")
        expect = {
            "SM_HOSTS": '["algo-1","algo-2"]',
            "SM_CURRENT_HOST": host,
            "SM_NUM_CPUS": str(os.cpu_count()),
            "SM_MODEL_DIR": str(root / "model"),
            "SM_INPUT_DIR": str(root / "input"),
            "SM_INPUT_CONFIG_DIR": str(root / "input" / "config"),
            "SM_OUTPUT_DIR": str(root / "output"),
            "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
            "SM_OUTPUT_INTERMEDIATE_DIR": str(root / "output" / "intermediate"),
            "SM_CHANNELS": '["eval","training"]',
            "SM_CHANNEL_TRAINING": str(root / "input" / "data" / "training"),
            "SM_CHANNEL_EVAL": str(root / "input" / "data" / "eval"),
            "SM_HPS": json.dumps(HPS, sort_keys=True, separators=(",", ":")),
            "SM_HP_EPOCHS": "3",
            "SM_HP_LR": "0.1",
            "SM_HP_NAME": "adam",
            "SM_HP_FLAG": "true",
            "SM_HP_OFF": "false",
            "SM_HP_LAYERS": "[1,2]",
            "SM_HP_OPTS": '{"a":"x","b":2}',
            "SM_HP_N": "5",
            "SM_HP_EMPTY": "",
            "SM_USER_ENTRY_POINT": "dump.py",
            "SM_MODULE_NAME": "dump",
            "SM_MODULE_DIR": spec.source_dir,
            "SM_FRAMEWORK_PARAMS": '{"sagemaker_mpi_custom_mpi_options":"","sagemaker_mpi_enabled":true,'
            '"sagemaker_mpi_num_of_processes_per_host":2}',
            "SM_NETWORK_INTERFACE_NAME": plan["interface"],
            "SM_LOG_LEVEL": "20",
            "SM_CURRENT_INSTANCE_TYPE": "local",
        }
        for k, v in expect.items():
            assert env[k] == v, (rank, k, env.get(k))
        assert json.loads(env["SM_RESOURCE_CONFIG"])["current_host"] == host
        assert json.loads(env["SM_INPUT_DATA_CONFIG"])["eval"]["ContentType"] == "text/csv"
        assert env["SM_NUM_GPUS"].isdigit()
        training = json.loads(env["SM_TRAINING_ENV"])
        assert training["is_master"] is (host == "algo-1")
        assert training["master_hostname"] == "algo-1"
        assert training["current_host"] == host and training["hosts"] == ["algo-1", "algo-2"]
        assert training["hyperparameters"] == HPS
        assert training["channel_input_dirs"] == {"training": expect["SM_CHANNEL_TRAINING"],
                                                  "eval": expect["SM_CHANNEL_EVAL"]}
        assert training["job_name"] == "contract-job" and training["module_name"] == "dump"
        assert training["additional_framework_parameters"]["sagemaker_mpi_enabled"] is True


def test_hora_rank_variables_follow_the_hosts(job):
    _, _, dumps, plan = job
    addresses = plan["addresses"]
    if plan["network"] == "loopback":
        assert addresses == ["127.0.0.1", "127.0.0.2"]  # each host has its own loopback address
    else:
        assert plan["interface"] == "eth0" and len(set(addresses)) == 2
    for rank, d in dumps.items():
        env, host_index = d["env"], rank // 2
        assert env["HORA_RANK"] == str(rank) and env["HORA_SIZE"] == "4"
        assert env["HORA_LOCAL_RANK"] == env["HOROVOD_LOCAL_RANK"] == str(rank % 2)
        assert env["HORA_LOCAL_SIZE"] == "2" and env["HORA_CROSS_SIZE"] == "2"
        assert env["HORA_CROSS_RANK"] == str(host_index)
        assert env["HORA_HOSTNAME"] == f"algo-{host_index + 1}"
        assert env["HORA_JOB_NAME"] == "contract-job"
        assert env["HORA_BIND_ADDR"] == addresses[host_index]
        assert d["torchrun"] == {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(rank % 2),
                                 "LOCAL_WORLD_SIZE": "2"}
        # hora itself sees two hosts of two ranks, and the allreduce across them is right
        assert d["topology"] == [rank, 4, rank % 2, 2, host_index, 2]
        assert d["sum"] == 6.0
        assert d["peer_addresses"] == [addresses[0], addresses[0], addresses[1], addresses[1]]
        assert d["transport"] == "hierarchical"  # two hosts: shared memory within each, TCP between them


@pytest.mark.skipif(os.geteuid() != 0, reason="host names resolve in a private mount namespace, which needs root")
def test_host_names_resolve_and_are_the_host_name(job):
    """As in a SageMaker container: algo-K resolves to host K's address, and it is the machine's name."""
    _spec, _hosts, dumps, plan = job
    for rank, d in dumps.items():
        assert d["resolved"] == {"algo-1": plan["addresses"][0], "algo-2": plan["addresses"][1]}, d["resolved"]
        assert d["hostname"] == f"algo-{rank // 2 + 1}"
        assert d["opt_ml"] == f"algo-{rank // 2 + 1}"  # the host's tree is at /opt/ml, as in a SageMaker container
    assert "algo-1" not in Path("/etc/hosts").read_text()  # the machine's own file is untouched
    assert not Path("/opt/ml/input/config").exists()  # nor its /opt/ml


def test_each_host_is_a_network_of_its_own(job):
    """With namespaces, the two ranks of a host share one network namespace, the hosts do not, and neither is this
    machine's; on loopback addresses everything shares this machine's."""
    _spec, _hosts, dumps, plan = job
    mine = os.stat("/proc/self/ns/net").st_ino
    per_host = [{dumps[r]["netns"] for r in (0, 1)}, {dumps[r]["netns"] for r in (2, 3)}]
    if plan["network"] == "namespace":
        assert all(len(s) == 1 for s in per_host) and per_host[0] != per_host[1] and mine not in per_host[0] | per_host[1]
    else:
        assert per_host == [{mine}, {mine}]


def test_the_namespaces_are_gone_after_the_job(job):
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if job[3]["network"] == "namespace":
        assert not any(name in listing for name in job[3]["namespaces"]), listing


def test_docs_name_every_variable_a_script_gets(job):

    text = (paths.DOCS / "jobs.md").read_text()
    for name in job[2][0]["env"]:
        if name.startswith("SM_HP_"):
            name = "SM_HP_<NAME>"
        elif name.startswith("SM_CHANNEL_"):
            name = "SM_CHANNEL_<NAME>"
        elif not (name.startswith("SM_") or name in ("HORA_JOB_NAME", "HORA_JOB_ATTEMPT")):
            continue
        assert f"`{name}`" in text, f"{name} is missing from docs/jobs.md"
