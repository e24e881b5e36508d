"""The job's plan (hora/plan.json): one writer, one reader that checks every field, and what the job's processes
ask of it (which host a rank runs on)."""

from __future__ import annotations

import json
import stat

import pytest

from hora.errors import StorageError
from hora.jobs.plan import JobPlan, ParameterServerPlan, plan_path
from hora.jobs.spec import MetricDefinition


def make_plan(**changes) -> JobPlan:
    fields = dict(
        job_name="plan-job",
        home="/tmp/home",
        hosts=("algo-1", "algo-2"),
        addresses=("10.1.2.1", "10.1.2.2"),
        network="namespace",
        namespaces=("hjn1-1", "hjn1-2"),
        interface="eth0",
        master_timeout=120.0,
        connect_timeout=30.0,
        grace=10.0,
        run_settings={"transport": "tcp", "stall_shutdown_time": 600.0, "cache_capacity": 0},
        mpi_exports={"HOROVOD_TIMELINE": "/opt/ml/output/data/timeline.json"},
        processes_per_host=3,
        command=("/usr/bin/python3", "train.py", "--epochs", "2"),
        python="/usr/bin/python3",
        strategy="parameter_server",
        parameter_server=ParameterServerPlan(
            "tensorflow", ("algo-1:2222", "algo-2:2222"), ("algo-1:2223", "algo-2:2223")
        ),
        metric_definitions=(MetricDefinition("loss", r"loss=([0-9.]+)"), MetricDefinition("acc", "acc=(.*)")),
        echo=False,
    )
    fields.update(changes)
    return JobPlan(**fields)


@pytest.mark.parametrize(
    "servers",
    [None, ParameterServerPlan("hora"), ParameterServerPlan("tensorflow", ("a:1", "b:1"), ("a:2", "b:2"))],
)
def test_the_plan_survives_its_json_unchanged(servers):
    plan = make_plan(parameter_server=servers)
    assert JobPlan.from_json(plan.to_json()) == plan


def test_the_file_keeps_the_names_the_tests_and_older_readers_know(tmp_path):
    plan = make_plan()
    plan.write(tmp_path)
    path = tmp_path / "hora" / "plan.json"
    assert plan_path(tmp_path) == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["hosts"] == ["algo-1", "algo-2"] and data["network"] == "namespace"
    assert data["parameter_server"] == {
        "servers": "tensorflow",
        "worker_addresses": ["algo-1:2222", "algo-2:2222"],
        "ps_addresses": ["algo-1:2223", "algo-2:2223"],
    }
    assert data["metric_definitions"][0] == {"Name": "loss", "Regex": r"loss=([0-9.]+)"}
    assert JobPlan.read(tmp_path) == plan
    assert json.loads(make_plan(parameter_server=ParameterServerPlan("hora")).to_json())[
        "parameter_server"
    ] == {"servers": "hora"}


def test_ranks_fill_the_hosts_in_order():
    plan = make_plan()
    assert plan.world_size == 6
    assert [plan.host_of_rank(r) for r in range(6)] == ["algo-1"] * 3 + ["algo-2"] * 3
    assert plan.host_index("algo-2") == 1
    with pytest.raises(StorageError, match=r"has ranks 0\.\.5, not rank 6"):
        plan.host_of_rank(6)
    with pytest.raises(StorageError, match=r"has no host 'algo-3'; its hosts are algo-1, algo-2"):
        plan.host_index("algo-3")


def _broken(change) -> str:
    data = json.loads(make_plan().to_json())
    change(data)
    with pytest.raises(StorageError) as info:
        JobPlan.from_json(json.dumps(data), "/jobs/x/hora/plan.json")
    message = str(info.value)
    assert message.startswith("/jobs/x/hora/plan.json is not a plan hora wrote (")
    assert message.endswith("start the job again (hora job run) rather than editing it")
    return message


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda d: d.pop("addresses"), "(no field 'addresses')"),
        (lambda d: d.update(hosts="algo-1"), "field 'hosts' is 'algo-1', not a list of strings"),
        (lambda d: d.update(hosts=[]), "field 'hosts' is empty"),
        (lambda d: d.update(addresses=["10.1.2.1"]), "1 address(es) for 2 host(s)"),
        (
            lambda d: d.update(network="bridge"),
            "field 'network' is 'bridge', not one of 'namespace', 'loopback'",
        ),
        (lambda d: d.update(namespaces=[]), "0 network namespace(s) for 2 host(s)"),
        (lambda d: d.update(master_timeout="2m"), "field 'master_timeout' is '2m', not a number"),
        (lambda d: d.update(grace=True), "field 'grace' is True, not a number"),
        (lambda d: d.update(processes_per_host=1.5), "field 'processes_per_host' is 1.5, not a whole number"),
        (lambda d: d.update(processes_per_host=0), "field 'processes_per_host' is 0; it must be at least 1"),
        (lambda d: d.update(command=[]), "field 'command' is empty"),
        (lambda d: d.update(echo="yes"), "field 'echo' is 'yes', not true or false"),
        (lambda d: d.update(run_settings=[1]), "field 'run_settings' is [1], not a JSON object"),
        (
            lambda d: d.update(mpi_exports={"A": 1}),
            "field 'mpi_exports' is {'A': 1}, not an object of strings",
        ),
        (lambda d: d.update(metric_definitions=[{"Name": "loss"}]), "no field 'metric_definitions[0].Regex'"),
        (
            lambda d: d.update(parameter_server={"servers": "mxnet"}),
            "field 'parameter_server.servers' is 'mxnet', not one of 'tensorflow', 'hora'",
        ),
        (
            lambda d: d.update(parameter_server=["hora"]),
            "field 'parameter_server' is list, not a JSON object",
        ),
        (
            lambda d: d["parameter_server"].update(ps_addresses=["algo-1:2223"]),
            "field 'parameter_server' has 2 worker and 1 ps address(es) for 2 host(s); it needs one of each per host",
        ),
    ],
)
def test_a_plan_hora_did_not_write_is_refused_naming_the_field(change, problem):
    assert problem in _broken(change)


def test_text_that_is_not_a_json_object_is_refused():
    with pytest.raises(StorageError, match=r"the job's plan is not a plan hora wrote \(Expecting value"):
        JobPlan.from_json("not json")
    with pytest.raises(StorageError, match=r"\(the plan is list, not a JSON object\)"):
        JobPlan.from_json("[1, 2]")
