"""SageMaker's own training toolkit (sagemaker-training, as the containers run it) sees a hora job exactly as the
SM_* variables describe it: hosts, current and master host, hyperparameters, channels, directories, CPUs and
processes per host."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

pytest.importorskip("sagemaker_training", reason="the toolkit test needs sagemaker-training (the test extra)")

from hora.jobs import JobStore, parse_spec, start_job

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from sagemaker_training import environment

    env = environment.Environment()
    seen = {
        "hosts": env.hosts, "current_host": env.current_host, "master_hostname": env.master_hostname,
        "hyperparameters": env.hyperparameters, "channel_input_dirs": env.channel_input_dirs,
        "model_dir": env.model_dir, "output_data_dir": env.output_data_dir, "output_dir": env.output_dir,
        "input_config_dir": env.input_config_dir, "num_cpus": env.num_cpus, "num_gpus": env.num_gpus,
        "network_interface_name": env.network_interface_name, "is_master": env.is_master,
        "processes_per_host": env.additional_framework_parameters.get("sagemaker_mpi_num_of_processes_per_host"),
        "user_entry_point": env.user_entry_point, "job_name": env.job_name,
    }
    sm = {k: v for k, v in os.environ.items() if k.startswith("SM_")}
    out = os.path.join(env.hyperparameters["out"], f"rank-{os.environ['HORA_RANK']}.json")
    with open(out, "w") as f:
        json.dump({"toolkit": seen, "sm": sm}, f)
""")


@pytest.mark.parametrize(("hosts", "per_host"), [(1, 1), (2, 2)])
def test_the_toolkit_sees_the_job_as_sagemaker_would_show_it(tmp_path, hosts, per_host):
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    spec = parse_spec({
        "entry_point": "train.py", "source_dir": str(src), "job_name": f"toolkit-{hosts}x{per_host}",
        "instance_count": hosts, "processes_per_host": per_host,
        "distribution": {"mpi": {"enabled": True, "processes_per_host": per_host}} if per_host > 1 else "none",
        "hyperparameters": {"out": str(out), "epochs": 3, "lr": 0.5, "name": "adam"},
        "inputs": {"training": str(src / "data")},
    })  # fmt: skip
    record = start_job(spec, JobStore(tmp_path / "home"), wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    for rank in range(hosts * per_host):
        got = json.loads((out / f"rank-{rank}.json").read_text())
        tk, sm = got["toolkit"], got["sm"]
        host = f"algo-{rank // per_host + 1}"
        assert tk["hosts"] == json.loads(sm["SM_HOSTS"]) == [f"algo-{k + 1}" for k in range(hosts)]
        assert tk["current_host"] == sm["SM_CURRENT_HOST"] == host
        assert tk["master_hostname"] == "algo-1" and tk["is_master"] == (host == "algo-1")
        assert tk["hyperparameters"] == json.loads(sm["SM_HPS"]) == {"out": str(out), "epochs": 3, "lr": 0.5, "name": "adam"}
        assert tk["channel_input_dirs"] == {"training": sm["SM_CHANNEL_TRAINING"]}
        assert (tk["model_dir"], tk["output_data_dir"], tk["output_dir"], tk["input_config_dir"]) == (
            sm["SM_MODEL_DIR"], sm["SM_OUTPUT_DATA_DIR"], sm["SM_OUTPUT_DIR"], sm["SM_INPUT_CONFIG_DIR"]
        )
        assert tk["num_cpus"] == int(sm["SM_NUM_CPUS"]) == os.cpu_count()
        assert tk["num_gpus"] == int(sm["SM_NUM_GPUS"]) == 0
        assert tk["network_interface_name"] == sm["SM_NETWORK_INTERFACE_NAME"]
        assert tk["user_entry_point"] == sm["SM_USER_ENTRY_POINT"] == "train.py"
        assert tk["job_name"] == spec.job_name
        if per_host > 1:
            assert tk["processes_per_host"] == per_host
