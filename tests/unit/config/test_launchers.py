"""Launcher detection: which launcher started the process and what rank/size it assigned (explicit env dicts only)."""

from __future__ import annotations

import pytest

from hora.config.launchers import LaunchInfo, detect, without_launcher_variables
from hora.errors import ConfigError

HORA = {
    "HORA_RANK": "1",
    "HORA_SIZE": "4",
    "HORA_LOCAL_RANK": "1",
    "HORA_LOCAL_SIZE": "2",
    "HORA_JOB_ID": "job-9",
}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "PMIX_NAMESPACE": "prterun-node-123@1",
}
TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "6",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "3",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "run7",
    "TORCHELASTIC_RESTART_COUNT": "1",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "4242",
    "SLURM_TASKS_PER_NODE": "4",
}


def test_no_launcher_is_a_single_process():
    assert detect({}) == LaunchInfo("none", 0, 1, 0, 1)
    assert detect({"PATH": "/usr/bin", "HOME": "/root"}) == LaunchInfo("none", 0, 1, 0, 1)


def test_empty_values_count_as_unset():
    env = {"HORA_RANK": "", "HORA_SIZE": "", "OMPI_COMM_WORLD_RANK": "", "RANK": "", "WORLD_SIZE": ""}
    assert detect(env).source == "none"


def test_hora():
    assert detect(HORA) == LaunchInfo("hora", 1, 4, 1, 2, job_key="job-9")


def test_hora_without_local_values():
    info = detect({"HORA_RANK": "0", "HORA_SIZE": "1"})
    assert info == LaunchInfo("hora", 0, 1, None, None, job_key="")


def test_open_mpi():
    assert detect(OMPI) == LaunchInfo("openmpi", 2, 8, 2, 4, job_key="ompi:prterun-node-123@1", multi_host=True)


def test_open_mpi_job_key_fallbacks():
    base = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert detect(base).job_key == ""
    assert detect({**base, "OMPI_MCA_ess_base_jobid": "77"}).job_key == "ompi:77"
    assert detect({**base, "OMPI_MCA_orte_hnp_uri": "uri"}).job_key == "ompi:uri"


def test_torchrun():
    info = detect(TORCHRUN)
    assert info == LaunchInfo(
        "torchrun", 3, 6, 0, 3, job_key="torchrun:run7:10.0.0.5:29500:1", master_addr="10.0.0.5", multi_host=True
    )


def test_torchrun_minimal():
    info = detect({"RANK": "0", "WORLD_SIZE": "2"})
    assert info == LaunchInfo("torchrun", 0, 2, None, None, job_key="", master_addr="")


def test_slurm_step():
    assert detect(SLURM) == LaunchInfo("slurm", 5, 8, 1, 4, job_key="slurm:4242.0", multi_host=True)


def test_slurm_heterogeneous_tasks_per_node_leaves_local_size_open():
    info = detect({**SLURM, "SLURM_TASKS_PER_NODE": "2(x3),2"})
    assert (info.source, info.local_rank, info.local_size) == ("slurm", 1, None)


def test_slurm_batch_step_without_step_id_is_a_single_process():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    assert detect(env) == LaunchInfo("none", 0, 1, 0, 1)


def test_precedence_hora_run_alone():
    """hora run's own workers: HORA_* and the torchrun names it exports alongside (equal values)."""
    own = {**HORA, "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    info = detect(own)
    assert (info.source, info.rank, info.size) == ("hora", 1, 4)


def test_precedence_mpirun_inside_hora_run_wins_over_stale_hora():
    """hora run removes OMPI_* from its workers, so OMPI_* next to HORA_* come from an mpirun inside it."""
    info = detect({**HORA, "RANK": "1", "WORLD_SIZE": "4", **OMPI})
    assert (info.source, info.rank, info.size) == ("openmpi", 2, 8)


def test_precedence_torchrun_inside_hora_run_wins_over_stale_hora():
    info = detect({**HORA, **TORCHRUN})
    assert (info.source, info.rank, info.size) == ("torchrun", 3, 6)


def test_precedence_rewritten_rank_without_torchelastic_wins_over_stale_hora():
    env = {**HORA, "RANK": "0", "WORLD_SIZE": "2"}
    assert (detect(env).source, detect(env).rank, detect(env).size) == ("torchrun", 0, 2)


def test_precedence_srun_inside_hora_run_wins_over_stale_hora():
    """hora run -np 1 srun -n 8 ...: every task inherits HORA_* (and RANK=HORA_RANK) of hora run's one worker."""
    env = {**HORA, "HORA_RANK": "0", "HORA_SIZE": "1", "RANK": "0", "WORLD_SIZE": "1", **SLURM}
    info = detect(env)
    assert (info.source, info.rank, info.size) == ("slurm", 5, 8)


def test_precedence_everything_at_once_is_open_mpi():
    assert detect({**SLURM, **TORCHRUN, **OMPI, **HORA}).source == "openmpi"


def test_what_hora_run_removes_lets_hora_win():
    """The same mix after hora run removed the other launchers' variables: its workers are hora ranks."""
    env = without_launcher_variables({**SLURM, **OMPI, **HORA, "RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "r"})
    assert "OMPI_COMM_WORLD_RANK" not in env and "SLURM_PROCID" not in env and "TORCHELASTIC_RUN_ID" not in env
    assert "SLURM_JOB_ID" in env and "PMIX_NAMESPACE" in env  # the allocation and the rest stay
    assert detect(env).source == "hora"


def test_slurm_step_ignores_incomplete_torch_exports():
    """A batch script's 'export WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=...' before srun: Slurm assigned the rank."""
    info = detect({**SLURM, "WORLD_SIZE": "8", "MASTER_ADDR": "node1"})
    assert (info.source, info.rank, info.size) == ("slurm", 5, 8)


def test_slurm_step_with_matching_torch_variables():
    info = detect({**SLURM, "RANK": "5", "WORLD_SIZE": "8"})
    assert (info.source, info.rank, info.size) == ("slurm", 5, 8)


def test_slurm_step_with_contradicting_torch_variables_is_an_error():
    with pytest.raises(ConfigError, match=r"^RANK=0 and WORLD_SIZE=8 contradict this Slurm job step's SLURM_PROCID=5 .*"
                       r"TORCHELASTIC_RUN_ID is unset"):
        detect({**SLURM, "RANK": "0", "WORLD_SIZE": "8"})


def test_slurm_multi_node_step():
    info = detect({**SLURM, "SLURM_TASKS_PER_NODE": "8", "SLURM_NTASKS": "8", "SLURM_LOCALID": "5"})
    assert not info.multi_host
    assert detect({**SLURM, "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NNODES": "2"}).multi_host


def test_precedence_mpirun_inside_slurm_allocation_is_open_mpi():
    info = detect({**SLURM, **OMPI})
    assert (info.source, info.rank, info.size) == ("openmpi", 2, 8)


def test_precedence_open_mpi_before_torchrun():
    assert detect({**TORCHRUN, **OMPI}).source == "openmpi"


def test_precedence_torchrun_before_slurm():
    info = detect({**SLURM, **TORCHRUN})
    assert (info.source, info.rank, info.size) == ("torchrun", 3, 6)


def test_rank_without_world_size():
    with pytest.raises(
        ConfigError, match=r"^RANK is set but WORLD_SIZE is not: the torchrun variables are incomplete\."
    ):
        detect({"RANK": "0"})


def test_world_size_without_rank():
    with pytest.raises(
        ConfigError, match=r"^WORLD_SIZE is set but RANK is not: the torchrun variables are incomplete\."
    ):
        detect({"WORLD_SIZE": "2"})


def test_incomplete_message_says_how_to_fix():
    with pytest.raises(ConfigError, match=r"hora run -np 4 python train\.py.*or unset HORA_SIZE\."):
        detect({"HORA_SIZE": "4"})


def test_incomplete_open_mpi():
    with pytest.raises(
        ConfigError, match=r"OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not: the Open MPI"
    ):
        detect({"OMPI_COMM_WORLD_RANK": "1"})


def test_incomplete_slurm_step():
    with pytest.raises(
        ConfigError, match=r"SLURM_PROCID is set but SLURM_NTASKS is not: the Slurm variables"
    ):
        detect({"SLURM_PROCID": "1", "SLURM_STEP_ID": "0"})


@pytest.mark.parametrize(("rank", "size"), [("4", "4"), ("5", "4"), ("-1", "4"), ("0", "0")])
def test_rank_outside_size(rank, size):
    with pytest.raises(
        ConfigError, match=rf"^RANK={rank} and WORLD_SIZE={size} are inconsistent: need 0 <= rank < size\.$"
    ):
        detect({"RANK": rank, "WORLD_SIZE": size})


def test_hora_rank_outside_size():
    with pytest.raises(ConfigError, match=r"^HORA_RANK=2 and HORA_SIZE=2 are inconsistent"):
        detect({"HORA_RANK": "2", "HORA_SIZE": "2"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "zero", "WORLD_SIZE": "2"}, r"^RANK='zero' is not a whole number \(torchrun sets it"),
        ({"RANK": "0", "WORLD_SIZE": "2.0"}, r"^WORLD_SIZE='2\.0' is not a whole number"),
        (
            {"HORA_RANK": "0", "HORA_SIZE": "2", "HORA_LOCAL_RANK": "x"},
            r"^HORA_LOCAL_RANK='x' is not a whole number \(hora",
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "two"},
            r"^OMPI_COMM_WORLD_SIZE='two' is not a whole number \(Open MPI",
        ),
        ({**SLURM, "SLURM_LOCALID": "?"}, r"^SLURM_LOCALID='\?' is not a whole number \(Slurm"),
    ],
)
def test_non_integer_values(env, message):
    with pytest.raises(ConfigError, match=message):
        detect(env)


@pytest.mark.parametrize(("lr", "ls"), [("2", "2"), ("3", "2"), ("-1", "2"), ("0", "0")])
def test_local_rank_outside_local_size(lr, ls):
    env = {**TORCHRUN, "LOCAL_RANK": lr, "LOCAL_WORLD_SIZE": ls}
    with pytest.raises(
        ConfigError,
        match=rf"^LOCAL_RANK={lr} and LOCAL_WORLD_SIZE={ls} are inconsistent: need 0 <= local rank < local size <= size \(6\)\.$",
    ):
        detect(env)


def test_local_size_above_size():
    with pytest.raises(ConfigError, match=r"HORA_LOCAL_RANK=0 and HORA_LOCAL_SIZE=4 are inconsistent"):
        detect({"HORA_RANK": "0", "HORA_SIZE": "2", "HORA_LOCAL_RANK": "0", "HORA_LOCAL_SIZE": "4"})


def test_open_mpi_local_inconsistent():
    with pytest.raises(ConfigError, match=r"OMPI_COMM_WORLD_LOCAL_RANK=4 and OMPI_COMM_WORLD_LOCAL_SIZE=4"):
        detect({**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "4"})


def test_slurm_local_inconsistent():
    with pytest.raises(ConfigError, match=r"SLURM_LOCALID=4 and SLURM_TASKS_PER_NODE=4 are inconsistent"):
        detect({**SLURM, "SLURM_LOCALID": "4"})


def test_error_in_higher_precedence_launcher_is_not_masked():
    # A broken hora environment must not silently fall through to a valid lower-precedence launcher.
    with pytest.raises(ConfigError, match="HORA_RANK is set but HORA_SIZE is not"):
        detect({"HORA_RANK": "0", "RANK": "0", "WORLD_SIZE": "2"})
