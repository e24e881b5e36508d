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
        bind_addr="10.0.0.2", settings={"transport": "tcp"}, cpus=8,
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


def _env(base, settings=None, cpus=8, local_size=2):
    return worker_env(
        base, rank=0, size=local_size, local_rank=0, local_size=local_size, cross_rank=0, cross_size=1, host="a",
        rendezvous=("127.0.0.1", 5000), secret=bytes(32), job_id="j", master_addr="127.0.0.1", master_port=6000,
        settings=settings, cpus=cpus,
    )  # fmt: skip


def test_each_rank_gets_its_share_of_the_cores_unless_the_user_set_it():
    assert (_env({})["OMP_NUM_THREADS"], _env({})["MKL_NUM_THREADS"]) == ("4", "4")
    assert _env({}, cpus=2, local_size=4)["OMP_NUM_THREADS"] == "1"  # never 0
    user = _env({"OMP_NUM_THREADS": "3"})
    assert (user["OMP_NUM_THREADS"], user["MKL_NUM_THREADS"]) == ("3", "4")  # the user's value wins, each alone
    assert "OMP_NUM_THREADS" not in _env({}, cpus=None)  # a remote host's agent sets them with its own count


def test_thread_defaults_can_be_turned_off_by_flag_setting_or_variable():
    assert "OMP_NUM_THREADS" not in _env({}, settings={"thread_defaults": False})
    assert "MKL_NUM_THREADS" not in _env({"HORA_THREAD_DEFAULTS": "0"})
