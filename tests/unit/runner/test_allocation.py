"""Slurm allocations as hora run's hosts (hostlist and tasks-per-node syntax), and hora run refusing to nest."""

from __future__ import annotations

import socket

import pytest

from hora.errors import ConfigError
from hora.runner.allocation import (
    Allocation,
    check_not_nested,
    expand_hostlist,
    expand_tasks_per_node,
    slurm_allocation,
)
from hora.runner.hosts import HostSlots


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("single", ["single"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("node[01-03,07],gpu-a[1-2]-x,single", ["node01", "node02", "node03", "node07", "gpu-a1-x", "gpu-a2-x", "single"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
        ("x[5]", ["x5"]),
        ("host-1.cluster,n[1-2].cluster", ["host-1.cluster", "n1.cluster", "n2.cluster"]),
        (" a , b[1-2] ", ["a", "b1", "b2"]),
    ],
)
def test_expand_hostlist(text, expected):
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n[1-3", r"'\[' without '\]'"),
        ("n1-3]", r"'\]' without '\['"),
        ("n[1-[2]]", r"nested '\['"),
        ("n[3-1]", r"range '3-1' in 'n\[3-1\]' runs backwards"),
        ("n[a-b]", r"'a-b' in 'n\[a-b\]' is not a number"),
        ("n[1,,2]", r"'' in 'n\[1,,2\]' is not a number"),
        ("", "is empty"),
    ],
)
def test_expand_hostlist_errors(text, message):
    with pytest.raises(ConfigError, match=rf"^SLURM_JOB_NODELIST: .*{message}|^SLURM_JOB_NODELIST {message}"):
        expand_hostlist(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3]), ("16(x1)", [16])],
)
def test_expand_tasks_per_node(text, expected):
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x)", "-1", "2x3"])
def test_expand_tasks_per_node_errors(text):
    with pytest.raises(ConfigError, match=r"^SLURM_TASKS_PER_NODE=.* is not N or N\(xR\)"):
        expand_tasks_per_node(text)


def test_allocation_from_tasks_per_node():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[01-03],gpu1", "SLURM_TASKS_PER_NODE": "2(x3),1",
           "SLURM_JOB_CPUS_PER_NODE": "8(x4)"}
    alloc = slurm_allocation(env)
    assert alloc is not None
    assert alloc.hosts == [HostSlots("node01", 2), HostSlots("node02", 2), HostSlots("node03", 2), HostSlots("gpu1", 1)]
    assert alloc.slots == 7
    assert "SLURM_JOB_NODELIST=node[01-03],gpu1" in alloc.source and "SLURM_TASKS_PER_NODE=2(x3),1" in alloc.source


def test_allocation_falls_back_to_cpus_per_node_and_to_slurm_nodelist():
    alloc = slurm_allocation({"SLURM_NODELIST": "a[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4,2"})
    assert alloc == Allocation([HostSlots("a1", 4), HostSlots("a2", 2)], alloc.source if alloc else "")
    assert alloc is not None and "SLURM_JOB_CPUS_PER_NODE=4,2" in alloc.source


def test_allocation_without_counts_gives_one_slot_per_node():
    alloc = slurm_allocation({"SLURM_JOB_NODELIST": "a,b"})
    assert alloc is not None and alloc.hosts == [HostSlots("a", 1), HostSlots("b", 1)]


def test_the_batch_scripts_node_is_this_machine_whatever_its_slurm_name():
    alloc = slurm_allocation({"SLURM_JOB_NODELIST": "cn[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "cn2"})
    assert alloc is not None and alloc.hosts == [HostSlots("cn1", 2), HostSlots(socket.gethostname(), 2)]


def test_no_allocation_outside_slurm_or_inside_a_step():
    assert slurm_allocation({}) is None
    assert slurm_allocation({"SLURM_JOB_NODELIST": "a", "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_ID": "0"}) is None


def test_allocation_count_mismatch():
    with pytest.raises(ConfigError, match=r"SLURM_TASKS_PER_NODE='2\(x2\)' gives 2 node\(s\) but SLURM_JOB_NODELIST='n\[1-3\]' names 3"):
        slurm_allocation({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"})


def test_allocation_names_a_host_twice():
    with pytest.raises(ConfigError, match="names a host twice"):
        slurm_allocation({"SLURM_JOB_NODELIST": "n[1-2],n1", "SLURM_TASKS_PER_NODE": "1(x3)"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, r"rank 1 of 4 under Open MPI's mpirun.*mpirun -np 4 python train\.py"),
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "9"}, r"rank 2 of 3 under a Slurm job step \(srun\).*srun -n 3"),
        ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}, r"rank 0 of 2 under torchrun"),
        ({"HORA_RANK": "1", "HORA_SIZE": "2"}, r"rank 1 of 2 under hora run"),
    ],
)
def test_nested_hora_run_is_refused(env, message):
    with pytest.raises(ConfigError, match=rf"^hora run is running as {message}"):
        check_not_nested(env)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},  # mpirun -np 1 hora run ...: one job, fine
        {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "a"},  # a batch script
        {"RANK": "x"},  # broken outer variables: hora run replaces them anyway
    ],
)
def test_not_nested(env):
    check_not_nested(env)
