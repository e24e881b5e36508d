"""The ``hora run`` command line in this process (hora.cli.main, the function ``python -m hora`` calls): bad flags,
a bad environment and bad combinations are refused with exit status 2 and a sentence before any rank starts; the
help lists the engine flags; a command that is not executable is exit status 126.

What reaches the workers end to end is tests/multiprocess/runner/test_flags.py; what the flags resolve to, against
the environment, is tests/unit/runner/test_flags.py.
"""

from __future__ import annotations

import os
import sys

import pytest

from hora.cli import main
from hora.errors import ConfigError
from hora.runner import run_command
from hora.runner.flags import check_settings


@pytest.fixture
def clean_env(monkeypatch):
    """No hora or Horovod variable in this process's environment."""
    for name in list(os.environ):
        if name.startswith(("HORA_", "HOROVOD_")):
            monkeypatch.delenv(name)
    return monkeypatch


def hora_run(capsys, *words: str) -> tuple[int, str, str]:
    """``hora run WORDS``: (exit status, stdout, stderr). argparse's usage errors and --help exit by SystemExit."""
    try:
        code = main(["run", *words])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--fusion-threshold-mb", "-1", "expected a finite number of MB >= 0"),
        ("--fusion-threshold-mb", "lots", "expected a finite number of MB >= 0"),
        ("--fusion-threshold-mb", "inf", "expected a finite number of MB >= 0"),
        ("--cycle-time-ms", "-1", "expected a finite number >= 0"),
        ("--cycle-time-ms", "nan", "expected a finite number >= 0"),
        ("--cache-capacity", "-1", "expected a whole number >= 0"),
        ("--cache-capacity", "1.5", "invalid literal"),
        ("--stall-check-warning-time-seconds", "0", "expected a finite number > 0"),
        ("--stall-check-shutdown-time-seconds", "-5", "expected a finite number >= 0"),
        ("--start-timeout", "-1", "expected a finite number > 0"),
    ],
)
def test_invalid_flag_values_are_clear_errors(capsys, clean_env, flag, value, reason):
    code, _, err = hora_run(capsys, "-np", "1", flag, value, sys.executable, "-c", "pass")
    assert code == 2, err
    assert f"argument {flag}: {value!r} is not valid: {reason}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HORA_FUSION_THRESHOLD", "64MB"),
        ("HOROVOD_CYCLE_TIME", "fast"),
        ("HOROVOD_CACHE_CAPACITY", "-1"),
        ("HORA_STALL_CHECK_DISABLE", "maybe"),
        ("HOROVOD_STALL_CHECK_TIME_SECONDS", "0"),
        ("HORA_STALL_SHUTDOWN_TIME_SECONDS", "never"),
        ("HOROVOD_TIMELINE_MARK_CYCLES", "2"),
        ("HOROVOD_GLOO_TIMEOUT_SECONDS", "-1"),
    ],
)
def test_invalid_environment_stops_the_launcher_before_any_rank_starts(capsys, clean_env, tmp_path, name, value):
    marker = tmp_path / "started"
    clean_env.setenv(name, value)
    code, _, err = hora_run(capsys, "-np", "2", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert code == 2, err
    assert f"hora run: invalid hora settings:\n  {name}={value!r} is not valid" in err
    assert "Traceback" not in err
    assert not marker.exists()


def test_stall_shutdown_flag_below_the_warning_time_is_refused(capsys, clean_env):
    code, _, err = hora_run(capsys, "-np", "1", "--stall-check-warning-time-seconds", "30",
                            "--stall-check-shutdown-time-seconds", "10", sys.executable, "-c", "pass")
    assert code == 2, err
    assert "--stall-check-shutdown-time-seconds 10 is less than --stall-check-warning-time-seconds 30" in err
    assert "--stall-check-shutdown-time-seconds sets HORA_STALL_SHUTDOWN_TIME_SECONDS" in err
    assert "--stall-check-warning-time-seconds sets HORA_STALL_CHECK_TIME_SECONDS" in err
    assert "Traceback" not in err


def test_a_warning_time_flag_above_the_environments_shutdown_time_is_refused(capsys, clean_env):
    # the other half (a shutdown flag made valid by the environment) is in tests/unit/runner/test_flags.py
    clean_env.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10")
    code, _, err = hora_run(capsys, "-np", "1", "--stall-check-warning-time-seconds", "20", sys.executable, "-c",
                            "pass")
    assert code == 2, err
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=10 is less than HORA_STALL_CHECK_TIME_SECONDS=20" in err


def test_help_lists_the_engine_flags(capsys):
    code, out, err = hora_run(capsys, "--help")
    assert code == 0, err
    for flag in ["--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity", "--timeline-filename",
                 "--timeline-mark-cycles", "--no-stall-check", "--stall-check-warning-time-seconds",
                 "--stall-check-shutdown-time-seconds", "--log-level"]:
        assert flag in out
    for name in ["HORA_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_GLOO_TIMEOUT_SECONDS"]:
        assert name in out


@pytest.mark.parametrize("port", ["-1", "70000", "http"])
def test_a_rendezvous_port_out_of_range_is_a_usage_error(capsys, port):
    code, _, err = hora_run(capsys, "-np", "1", "--rendezvous-port", port, "true")
    assert code == 2 and "Traceback" not in err, err
    assert "is not a port number" in err and "0-65535" in err


def test_a_command_that_is_not_executable_is_a_sentence_and_126(capsys, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")
    script.chmod(0o644)
    code, _, err = hora_run(capsys, "-np", "2", str(script))
    assert code == 126 and "Traceback" not in err, err
    assert f"cannot start {str(script)!r}: Permission denied (is it an executable file?" in err


@pytest.mark.parametrize(
    ("words", "env", "expected"),
    [
        (["--strategy", "parameter_server"], {},
         "--strategy parameter_server needs parameter servers, and this job starts none: add --num-ps S"),
        ([], {"HORA_STRATEGY": "parameter_server"},
         "HORA_STRATEGY=parameter_server (from the environment) needs parameter servers"),
        (["--ps-consistency", "sync", "--ps-checkpoint-steps", "5"], {},
         "--ps-consistency sync, --ps-checkpoint-steps 5 configure parameter servers, and this job starts none"),
        (["--num-ps", "1", "--max-restarts", "2"], {}, "--max-restarts 2 needs --ps-checkpoint-dir DIR"),
    ],
    ids=["strategy-flag", "strategy-env", "server-flags", "restarts-without-checkpoints"],
)
def test_a_job_no_rank_could_run_is_refused_before_any_rank_starts(capsys, clean_env, tmp_path, words, env, expected):
    # Before: the ranks imported their framework and each failed in DistributedOptimizer, seconds later.
    marker = tmp_path / "started"
    for name, value in env.items():
        clean_env.setenv(name, value)
    code, _, err = hora_run(capsys, "-np", "2", *words, sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert code == 2, err
    assert err.startswith(f"hora run: {expected}"), err
    assert "Traceback" not in err
    assert not marker.exists()


@pytest.mark.parametrize("servers", [{"num_ps": 1}, {"ps_per_host": 1}], ids=["num-ps", "ps-per-host"])
def test_the_parameter_server_strategy_with_servers_passes_the_check(servers):
    assert check_settings({"strategy": "parameter_server", "ps_consistency": "sync", **servers}, env={}) == ""


def test_run_command_refuses_the_same_contradictions_before_any_rank_starts(clean_env, tmp_path):
    marker = tmp_path / "started"
    with pytest.raises(ConfigError, match=r"^--strategy parameter_server needs parameter servers"):
        run_command([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], np=1, strategy="parameter_server")
    assert not marker.exists()


def test_ctrl_c_anywhere_in_the_command_ends_it_with_one_line_and_130(monkeypatch, capsys):
    """Issue 27, item 2: a Ctrl-C that reached the top printed dozens of KeyboardInterrupt frames."""
    import hora.cli
    from hora.__main__ import run

    def interrupted() -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(hora.cli, "main", interrupted)
    assert run() == 130
    assert capsys.readouterr().err == "hora: interrupted\n"
