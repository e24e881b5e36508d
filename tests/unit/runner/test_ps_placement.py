"""Where ``--num-ps`` / ``--ps-per-host`` put the parameter servers, and the settings' errors (nothing launched)."""

from __future__ import annotations

import pytest

from hora.config import Config
from hora.errors import ConfigError
from hora.runner.flags import parse_run_options, settings_from_args
from hora.runner.hosts import HostSlots, place_servers
from hora.runner.launch import LaunchSpec, launch


def test_servers_go_round_robin_over_the_hosts_that_run_ranks():
    assert place_servers(0, 0, ["a", "b"]) == []
    assert place_servers(2, 0, ["a"]) == ["a", "a"]  # one host: every server there, as before
    assert place_servers(0, 1, ["a", "b", "c"]) == ["a", "b", "c"]
    assert place_servers(0, 2, ["a", "b"]) == ["a", "b", "a", "b"]  # server i on host i % hosts
    assert place_servers(4, 2, ["a", "b"]) == ["a", "b", "a", "b"]  # --num-ps may repeat the total
    assert place_servers(3, 0, ["a", "b"]) == [
        "a",
        "b",
        "a",
    ]  # --num-ps alone: spread, the first hosts one more


def test_setting_errors_name_both_flags_and_the_fix():
    with pytest.raises(ConfigError) as exc:
        place_servers(3, 2, ["a", "b"])
    assert str(exc.value) == (
        "--num-ps 3 and --ps-per-host 2 disagree: 2 server(s) on each of the job's 2 host(s) (a, b) is 4 in all; "
        "drop --num-ps (HORA_NUM_PS) or make it 4"
    )
    assert Config.resolve(env={"HORA_PS_PER_HOST": "2"}).ps_per_host == 2
    with pytest.raises(ConfigError, match="HORA_PS_PER_HOST"):
        Config.resolve(env={"HORA_PS_PER_HOST": "-1"})
    args = parse_run_options(["-np", "4", "--ps-per-host", "1", "--num-ps", "2"])
    assert settings_from_args(args) == {"num_ps": 2, "ps_per_host": 1}
    # hora run refuses before it checks or starts anything: these hosts do not exist, SSH would fail on them
    spec = LaunchSpec(["true"], 2, env={}, settings={"num_ps": 3, "ps_per_host": 1},
                      hosts=[HostSlots("node-a.invalid", 1), HostSlots("node-b.invalid", 1)])  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"--num-ps 3 and --ps-per-host 1 disagree: .* \(node-a\.invalid, node-b"
    ):
        launch(spec)


def test_an_unusable_checkpoint_directory_is_refused_before_the_job_starts(tmp_path):
    """Issue 27, item 7: an unwritable --ps-checkpoint-dir failed only after 33 s, through a RendezvousError."""
    import pytest

    from hora.errors import ConfigError
    from hora.runner.ps_servers import check_checkpoint_dir

    check_checkpoint_dir(str(tmp_path / "new" / "dir"))  # made
    assert (tmp_path / "new" / "dir").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"--ps-checkpoint-dir .*/file/ckpt cannot be used \(Not a directory\)"):
        check_checkpoint_dir(str(tmp_path / "file" / "ckpt"))
