"""Every environment variable hora reads outside its settings is declared once (hora.config.variables); reading an
undeclared one is a bug, and the launcher -> worker contract is one table that the writer follows exactly."""

from __future__ import annotations

import pytest

from hora.config.variables import VARIABLES, environment, read, sm_channel_dir
from hora.config.worker_env import WORKER_VARIABLES, worker_env


def test_declared_variables_are_read_from_the_given_environment():
    assert read("HORA_JOB_HOME", {"HORA_JOB_HOME": "/x"}) == "/x"
    assert read("HORA_JOB_HOME", {}) is None
    assert sm_channel_dir("train", {"SM_CHANNEL_TRAIN": "/opt/ml/input/data/train"}) == "/opt/ml/input/data/train"


def test_an_undeclared_variable_cannot_be_read():
    with pytest.raises(KeyError, match="HORA_NOT_A_VARIABLE is not declared"):
        read("HORA_NOT_A_VARIABLE", {})


def test_variables_are_declared_once():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))


def test_environment_is_a_copy(monkeypatch):
    monkeypatch.setenv("HORA_JOB_HOME", "/y")
    env = environment()
    env["HORA_JOB_HOME"] = "/z"
    assert read("HORA_JOB_HOME") == "/y"


def test_the_writer_writes_exactly_the_contract():
    env = worker_env(
        {"PATH": "/bin"}, rank=3, size=4, local_rank=1, local_size=2, cross_rank=1, cross_size=2, host="b",
        rendezvous=("10.0.0.1", 5000), secret=bytes(32), job_id="j", master_addr="10.0.0.1", master_port=6000,
        bind_addr="10.0.0.2", settings={"transport": "tcp"},
    )  # fmt: skip
    contract = {name for v in WORKER_VARIABLES for name in v.names}
    assert set(env) - {"PATH", "HORA_TRANSPORT"} == contract
    assert env["HORA_TRANSPORT"] == "tcp" and env["PATH"] == "/bin"
    assert (env["HORA_RANK"], env["RANK"], env["HOROVOD_RANK"]) == ("3", "3", "3")
    assert (env["HORA_CROSS_RANK"], env["LOCAL_WORLD_SIZE"], env["HORA_HOSTNAME"]) == ("1", "2", "b")
    assert env["HORA_SECRET"] == "00" * 32


def test_no_bind_address_without_one():
    env = worker_env(
        {}, rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, host="a",
        rendezvous=("127.0.0.1", 1), secret=bytes(32), job_id="j", master_addr="127.0.0.1", master_port=2,
    )  # fmt: skip
    assert "HORA_BIND_ADDR" not in env
