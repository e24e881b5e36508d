"""SageMaker's parameter_server distribution, in-process: the spec forms and their errors, TF_CONFIG as the TensorFlow
container builds it, the hyperparameters and SM_* variables the SDK and the toolkit give it, the plan's tasks."""

from __future__ import annotations

import json
import socket

import pytest

from hora.errors import ConfigError
from hora.jobs import SpecError, TensorFlow, parse_spec
from hora.jobs.parameter_server import (
    PS_PORT,
    WORKER_PORT,
    MasterWatch,
    build_tf_config,
    hora_ps_run_settings,
    plan_entry,
    ps_command,
    tf_config_for,
)
from hora.jobs.plan import ParameterServerPlan
from hora.jobs.sagemaker_env import HostLayout, encode_hyperparameters, sm_environment, write_host_config
from hora.jobs.spec import spec_from_dict


def container_build_tf_config_for_ps(hosts, current_host, ps_task=False):
    """``sagemaker_tensorflow_container/training.py::_build_tf_config_for_ps`` (sagemaker-tensorflow-training
    20.5.0), copied as it is (``_is_host_master`` inlined): the reference hora's TF_CONFIG must equal, key order
    included."""
    masters = hosts[:1]
    workers = hosts[1:]
    ps = hosts if len(hosts) > 1 else None

    def host_addresses(hosts, port=2222):
        return ["{}:{}".format(host, port) for host in hosts]  # noqa: UP032 - verbatim

    tf_config = {"cluster": {"master": host_addresses(masters)}, "environment": "cloud"}

    if ps:
        tf_config["cluster"]["ps"] = host_addresses(ps, port="2223")

    if workers:
        tf_config["cluster"]["worker"] = host_addresses(workers)

    if ps_task:
        if ps is None:
            raise ValueError("Cannot have a ps task if there are no parameter servers in the cluster")
        task_type = "ps"
        task_index = ps.index(current_host)
    elif current_host == hosts[0]:
        task_type = "master"
        task_index = 0
    else:
        task_type = "worker"
        task_index = workers.index(current_host)

    tf_config["task"] = {"index": task_index, "type": task_type}
    return tf_config


@pytest.fixture
def code(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def problems(data, base) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data, base_dir=base)
    return info.value.problems


def test_tf_config_for_two_hosts_is_the_containers_byte_for_byte():
    hosts = ["algo-1", "algo-2"]
    assert json.dumps(build_tf_config(hosts, "algo-1")) == (
        '{"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"], "worker": ["algo-2:2222"]}, '
        '"environment": "cloud", "task": {"index": 0, "type": "master"}}'
    )
    assert build_tf_config(hosts, "algo-2")["task"] == {"index": 0, "type": "worker"}
    assert build_tf_config(hosts, "algo-2", ps_task=True)["task"] == {"index": 1, "type": "ps"}


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_tf_config_equals_the_containers_for_every_host_and_task(count):
    hosts = [f"algo-{k + 1}" for k in range(count)]
    for host in hosts:
        for ps_task in ([False, True] if count > 1 else [False]):
            ours, theirs = build_tf_config(hosts, host, ps_task), container_build_tf_config_for_ps(hosts, host, ps_task)
            assert json.dumps(ours) == json.dumps(theirs)
    if count == 1:
        with pytest.raises(ValueError, match="no parameter servers"):
            build_tf_config(hosts, "algo-1", ps_task=True)


def test_the_plan_uses_the_containers_ports_on_namespaces_and_machines_and_free_ports_on_loopback():
    hosts = ["algo-1", "algo-2", "algo-3"]
    assert plan_entry("mpi", "tensorflow", hosts, [], True) is None
    assert plan_entry("parameter_server", "tensorflow", hosts[:1], ["10.0.0.1"], True) is None  # one host: no PS
    entry = plan_entry("parameter_server", "tensorflow", hosts, ["10.9.9.1", "10.9.9.2", "10.9.9.3"], True)
    assert entry == ParameterServerPlan(
        "tensorflow", tuple(f"{h}:{WORKER_PORT}" for h in hosts), tuple(f"{h}:{PS_PORT}" for h in hosts)
    )
    # real machines (cluster:): their own ports, addressed by address (algo-K resolves there only for root); no
    # port is chosen on this machine, which cannot bind those addresses
    entry = plan_entry("parameter_server", "tensorflow", hosts, ["10.9.9.1", "10.9.9.2", "fd00::3"], False, True)
    assert entry == ParameterServerPlan(
        "tensorflow", ("10.9.9.1:2222", "10.9.9.2:2222", "[fd00::3]:2222"),
        ("10.9.9.1:2223", "10.9.9.2:2223", "[fd00::3]:2223"))
    addresses = ["127.0.0.1", "127.0.0.1", "127.0.0.1"]
    entry = plan_entry("parameter_server", "tensorflow", hosts, addresses, False)
    assert entry is not None
    every = entry.worker_addresses + entry.ps_addresses
    assert all(a.startswith("127.0.0.1:") for a in every) and len(set(every)) == 6  # one port space: all differ
    with socket.socket() as s:  # free ports: the tasks can bind them
        s.bind(("127.0.0.1", int(every[0].rsplit(":", 1)[1])))
    # outside the kernel's ephemeral range, so no bind(0) or connect on the machine can take them before the tasks
    # (TensorFlow's import takes seconds) bind them: "Could not start gRPC server"
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    assert all(int(a.rsplit(":", 1)[1]) < ephemeral for a in every), (every, ephemeral)
    config = tf_config_for(entry, hosts, "algo-3")
    assert config == {
        "cluster": {
            "master": list(entry.worker_addresses[:1]),
            "ps": list(entry.ps_addresses),
            "worker": list(entry.worker_addresses[1:]),
        },
        "environment": "cloud",
        "task": {"index": 1, "type": "worker"},
    }
    command = ps_command(entry, hosts, "algo-2", "/usr/bin/python3")
    assert command[:3] == ["/usr/bin/python3", "-m", "hora.jobs._tf_ps"]
    assert json.loads(command[3]) == config["cluster"] and command[4] == "1"
    assert tf_config_for(None, hosts, "algo-1") is None
    with pytest.raises(ConfigError, match="runs no TensorFlow parameter servers"):
        ps_command(None, hosts, "algo-1")


def test_the_distribution_forms_and_what_the_sdk_and_toolkit_make_of_them(code, tmp_path):
    forms = [
        {"distribution": {"parameter_server": {"enabled": True}}},
        {"distribution": "parameter_server"},
        {"distribution": {"parameter_server": {"enabled": True, "servers": "tensorflow"}},
         "processes_per_host": 1},
        {"distribution": {"mpi": {"enabled": False}, "parameter_server": {"enabled": True}}},
        {"hyperparameters": {"sagemaker_parameter_server_enabled": True, "epochs": 2}},  # the SDK's own form
        {"hyperparameters": {"sagemaker_parameter_server_enabled": "true", "epochs": 2},
         "distribution": {"parameter_server": {"enabled": True}}},
    ]
    for extra in forms:
        spec = parse_spec({"entry_point": "train.py", "instance_count": 2, "job_name": "ps", **extra}, base_dir=code)
        assert (spec.strategy, spec.ps_servers, spec.processes_per_host) == ("parameter_server", "tensorflow", 1)
        assert "sagemaker_parameter_server_enabled" not in spec.hyperparameters
        assert spec_from_dict(spec.to_dict()) == spec
    hps = encode_hyperparameters(spec)
    assert hps["sagemaker_parameter_server_enabled"] == "true" and hps["epochs"] == "2"
    assert not any(k.startswith("sagemaker_mpi") for k in hps)
    layout = HostLayout(tmp_path / "algo-2")
    write_host_config(spec, layout, "algo-2")
    env = sm_environment(spec, layout, "algo-2", cpus=2, gpus=0)
    assert json.loads(env["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_parameter_server_enabled": True}
    assert json.loads(env["SM_HPS"]) == {"epochs": 2}
    assert env["SM_USER_ARGS"] == '["--epochs","2"]'
    assert json.loads(env["SM_DISTRIBUTION_INSTANCE_GROUPS"]) == ["homogeneousCluster"]
    training = json.loads(env["SM_TRAINING_ENV"])
    assert training["distribution_hosts"] == ["algo-1", "algo-2"] and training["is_master"] is False
    assert training["additional_framework_parameters"] == {"sagemaker_parameter_server_enabled": True}
    # disabled everywhere: no distribution, and a false hyperparameter stays as the SDK writes it
    spec = parse_spec({"entry_point": "train.py", "distribution": {"parameter_server": {"enabled": False}},
                       "hyperparameters": {"sagemaker_parameter_server_enabled": False}}, base_dir=code)
    assert spec.strategy == "none" and encode_hyperparameters(spec)["sagemaker_parameter_server_enabled"] == "false"


def test_bad_combinations_are_refused_with_the_fix(code):
    base = {"entry_point": "train.py", "instance_count": 2}
    assert problems({**base, "distribution": {"mpi": {"enabled": True}, "parameter_server": {"enabled": True}}},
                    code) == [
        "distribution enables mpi and parameter_server at once; a job runs one distribution strategy: keep one of "
        "them (or set enabled: false on the others)"
    ]
    assert problems({**base, "processes_per_host": 2, "distribution": "parameter_server"}, code) == [
        "distribution parameter_server runs one worker process per host, as SageMaker does, but processes_per_host "
        "is 2; drop processes_per_host (or use mpi / allreduce for several processes per host)"
    ]
    found = problems({**base, "distribution": {"parameter_server": {"enabled": True, "processes_per_host": 2,
                                                                    "custom_mpi_options": "-x"}}}, code)
    assert found == ["unknown field 'processes_per_host' in distribution.parameter_server; known fields: enabled, servers",
                     "unknown field 'custom_mpi_options' in distribution.parameter_server; known fields: enabled, servers"]
    assert problems({**base, "distribution": {"parameter_server": {"servers": "byteps"}}}, code) == [
        "distribution.parameter_server.servers must be one of tensorflow, hora, got 'byteps'"
    ]
    assert parse_spec({**base, "distribution": {"parameter_server": {"servers": "hora"}}}, base_dir=code).ps_servers == "hora"
    assert problems({**base, "distribution": "mpi", "hyperparameters": {"sagemaker_parameter_server_enabled": True}},
                    code) == [
        "hyperparameter sagemaker_parameter_server_enabled is true but distribution is mpi; a job runs one "
        "distribution strategy: drop one of them"
    ]
    assert problems({**base, "distribution": "parameter_server",
                     "hyperparameters": {"sagemaker_parameter_server_enabled": False}}, code) == [
        "hyperparameter sagemaker_parameter_server_enabled is false but distribution is parameter_server; drop one "
        "of them"
    ]
    assert problems({**base, "hyperparameters": {"sagemaker_parameter_server_enabled": "yes"}}, code) == [
        "hyperparameter sagemaker_parameter_server_enabled must be true or false, got 'yes'"
    ]


def test_horas_own_servers_run_one_per_host_on_one_host_too():
    assert hora_ps_run_settings(3) == {"num_ps": 3, "ps_per_host": 1}
    with pytest.raises(ConfigError, match="at least one host"):
        hora_ps_run_settings(0)
    # hora run places and addresses them (hora.ps.connect), also on one host: no TF_CONFIG, no TensorFlow task
    for hosts in (["algo-1"], ["algo-1", "algo-2"]):
        entry = plan_entry("parameter_server", "hora", hosts, ["10.0.0.1"] * len(hosts), True)
        assert entry == ParameterServerPlan("hora")
        assert tf_config_for(entry, hosts, hosts[0]) is None


def test_a_worker_host_learns_the_masters_end_from_its_record_or_its_server_going_away(tmp_path, monkeypatch):
    monkeypatch.setattr(MasterWatch, "PROBE_SECONDS", 0.0)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    watch = MasterWatch(tmp_path, 1, address)
    assert not watch.ended()  # nothing listens yet: the master's server may still be starting
    server.listen(4)
    assert not watch.ended() and watch.served  # it serves: the master runs
    server.close()
    assert watch.ended()  # it served and went away: the master's script has ended (its record may be missing)
    record = tmp_path / "hora" / "attempt-2" / "rank-0.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    assert MasterWatch(tmp_path, 2, address).ended()  # the master's record says so at once


def test_the_sdks_tensorflow_estimator_takes_the_distribution(code):
    est = TensorFlow(entry_point="train.py", source_dir=str(code), instance_count=2, instance_type="ml.c5.xlarge",
                     framework_version="2.21", py_version="py311", role="arn:aws:iam::1:role/x",
                     distribution={"parameter_server": {"enabled": True}}, home=str(code / "home"))
    assert parse_spec({**est.fields, "job_name": "sdk"}).strategy == "parameter_server"
    with pytest.raises(SpecError, match="distribution enables mpi and parameter_server at once"):
        TensorFlow(entry_point="train.py", source_dir=str(code), instance_count=2, home=str(code / "home"),
                   distribution={"mpi": {"enabled": True}, "parameter_server": {"enabled": True}})
