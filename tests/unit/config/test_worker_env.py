"""The one writer of a worker's environment, with hora job's additions (JOB_VARIABLES), and the keys a wrapper
reads back from what hora run wrote."""

from __future__ import annotations

import pytest

from hora.config.worker_env import JOB_VARIABLES, WORKER_VARIABLES, JobExtras, JobKeys, worker_env
from hora.errors import ConfigError
from support import paths

ARGS = dict(
    rank=3,
    size=4,
    local_rank=1,
    local_size=2,
    cross_rank=1,
    cross_size=2,
    host="algo-2",
    rendezvous=("10.1.2.1", 41873),
    secret=bytes(range(32)),
    job_id="3fa85f6457174562",
    master_addr="10.1.2.1",
    master_port=45211,
    bind_addr="10.1.2.2",
)


def test_hora_jobs_variables_are_declared_in_the_table_and_written_by_the_same_writer():
    env = worker_env({}, **ARGS, job=JobExtras("my-job", "/jobs/my-job/hosts/algo-2"))
    declared = {name for v in (*WORKER_VARIABLES, *JOB_VARIABLES) for name in v.names}
    declared -= {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}  # written only with cpus=
    assert set(env) == declared
    assert set(env) - set(worker_env({}, **ARGS)) == {name for v in JOB_VARIABLES for name in v.names}
    assert env["GROUP_RANK"] == env["HORA_CROSS_RANK"] == "1"
    assert env["HORA_JOB_NAME"] == env["TRAINING_JOB_NAME"] == "my-job"
    assert env["SAGEMAKER_BASE_DIR"] == "/jobs/my-job/hosts/algo-2"
    assert env["HORA_BIND_ADDR"] == "10.1.2.2" and env["MASTER_ADDR"] == "10.1.2.1"


def test_the_jobs_exports_are_written_last_and_win():
    base = {"OMP_NUM_THREADS": "7", "MINE": "kept"}
    exports = {"OMP_NUM_THREADS": "2", "HOROVOD_TIMELINE": "/t.json", "HORA_JOB_NAME": "renamed"}
    env = worker_env(base, **ARGS, cpus=8, job=JobExtras("my-job", "/opt/ml", exports))
    assert env["OMP_NUM_THREADS"] == "2" and env["HOROVOD_TIMELINE"] == "/t.json" and env["MINE"] == "kept"
    assert env["HORA_JOB_NAME"] == "renamed"  # as mpirun's -x, an export beats every other value
    assert env["MKL_NUM_THREADS"] == "4"  # the thread default for 2 local ranks on 8 cores


def test_a_wrapper_reads_back_the_keys_hora_run_drew_for_the_job():
    env = worker_env({}, **ARGS)
    keys = JobKeys.from_env(env)
    assert keys == JobKeys(("10.1.2.1", 41873), bytes(range(32)), "3fa85f6457174562", 45211)
    rewritten = worker_env(
        env,
        **{**ARGS, "rendezvous": keys.rendezvous, "secret": keys.secret, "job_id": keys.job_id},
        job=JobExtras("j", "/opt/ml"),
    )
    assert {k: v for k, v in rewritten.items() if k in env} == env  # the contract's values unchanged


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"HORA_SECRET": ""}, "HORA_SECRET is not set: this process is not a worker that hora run started"),
        ({"MASTER_PORT": "x1"}, "MASTER_PORT='x1' is not a port number, as hora run writes it"),
        ({"HORA_SECRET": "zz"}, "HORA_SECRET='zz' is not hex, as hora run writes it"),
    ],
)
def test_keys_missing_or_invalid_are_a_clear_error(change, message):
    env = {**worker_env({}, **ARGS), **change}
    with pytest.raises(ConfigError, match=message):
        JobKeys.from_env(env)


def test_docs_jobs_md_names_every_job_variable():
    text = (paths.DOCS / "jobs.md").read_text()
    for variable in JOB_VARIABLES:
        for name in variable.names:
            assert f"`{name}`" in text, f"{name} is missing from docs/jobs.md"
