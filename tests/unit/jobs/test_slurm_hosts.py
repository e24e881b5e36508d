"""hora job inside a Slurm allocation, the pure parts: the allocation's nodes as algo-1..N and the errors outside
one (hora.jobs.slurm_hosts), and the srun command the agent runs (hora.jobs._srun_rsh). The real thing runs in
tests/multiprocess/jobs/test_slurm_job.py."""

from __future__ import annotations

import sys

import pytest

from hora.errors import ConfigError
from hora.jobs._srun_rsh import srun_command, srun_environment
from hora.jobs.remote_hosts import ssh_options
from hora.jobs.remote_spec import ClusterSpec
from hora.jobs.slurm_hosts import allocation_cluster

ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_TASKS_PER_NODE": "8(x3)"}


def test_the_allocations_first_nodes_become_the_hosts_in_order():
    spec = ClusterSpec((), work_dir="/scratch/{host}", backend="slurm")
    cluster = allocation_cluster(spec, ALLOCATION, 2)
    assert cluster == ClusterSpec(("gpu01", "gpu02"), work_dir="/scratch/{host}", backend="slurm", slurm_job_id="77")
    assert allocation_cluster(None, ALLOCATION, None).hosts == ("gpu01", "gpu02", "gpu03")  # hora job clean
    options = ssh_options(cluster)  # srun in place of ssh: the node, then the command, follow
    assert options.agent == [sys.executable, "-m", "hora.jobs._srun_rsh", "77"]


def test_outside_an_allocation_it_says_how_to_get_one():
    with pytest.raises(ConfigError) as err:
        allocation_cluster(None, {"PATH": "/bin"}, 2, "hora job run job.yaml --slurm")
    assert str(err.value) == (
        "hora job --slurm runs inside a Slurm allocation and this is not one (SLURM_JOB_ID and SLURM_JOB_NODELIST are "
        "not set): run it under salloc -N 2 (salloc -N 2 hora job run job.yaml --slurm) or in an sbatch script "
        "(#SBATCH -N 2, then hora job run job.yaml --slurm); each node of the allocation is one host algo-K")


def test_inside_a_job_step_it_is_refused_as_hora_run_does():
    with pytest.raises(ConfigError, match=r"inside a job step \(srun; SLURM_STEP_ID=0 of Slurm job 77\): it starts a "
                                          r"step on each node itself; run it under salloc -N 2 .*, not under srun"):
        allocation_cluster(None, {**ALLOCATION, "SLURM_STEP_ID": "0"}, 2)


def test_fewer_nodes_than_instances_names_both_counts():
    with pytest.raises(ConfigError, match=r"SLURM_JOB_NODELIST=gpu\[01-03\]\) has 3 node\(s\) but the spec's "
                                          r"instance_count is 4: .*salloc -N 4, #SBATCH -N 4\) or set instance_count: 3"):
        allocation_cluster(None, ALLOCATION, 4)


def test_slurm_with_the_specs_ssh_hosts_is_refused():
    with pytest.raises(ConfigError, match=r"the spec's cluster has cluster.hosts, cluster.ssh_port: remove them"):
        allocation_cluster(ClusterSpec(("a",), ssh_port=22), ALLOCATION, 1)


def test_the_srun_command_and_its_environment():
    env = {"PATH": "/usr/bin", "HOME": "/home/me", "SLURM_CONF": "/etc/slurm.conf", "SLURM_CPUS_PER_TASK": "4",
           "SLURM_JOB_ID": "77", "SSH_CONNECTION": "1.2.3.4 5 6.7.8.9 22", "AWS_SECRET_ACCESS_KEY": "s"}
    argv = srun_command("77", "gpu02", "exec python -m x", env)
    assert argv[:11] == ["srun", "--jobid=77", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu02",
                         "--kill-on-bad-exit=1", "--quiet", "--unbuffered", "--export=PATH,HOME", "--job-name=hora-job"]
    assert argv[11:13] == ["/bin/sh", "-c"] and argv[-2:] == ["sh", "exec python -m x"]
    # srun reads the allocation's shape variables (an sbatch -c 4 would make every step 4 CPUs): not given them
    assert srun_environment(env) == {k: v for k, v in env.items() if k not in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_ID")}
