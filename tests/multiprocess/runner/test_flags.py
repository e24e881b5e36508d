"""`hora run`'s engine-setting flags: what the workers resolve, precedence against the environment, errors, help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from support import paths

SHOW_CONFIG = paths.SCRIPTS / "show_config.py"

DEFAULTS = {
    "fusion_threshold": 64 * 1024 * 1024,
    "cycle_time_ms": 1.0,
    "cache_capacity": 1024,
    "stall_check_disable": False,
    "stall_check_time": 60.0,
    "stall_shutdown_time": 0.0,
    "timeline": "",
    "timeline_mark_cycles": False,
}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any hora or Horovod variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORA_", "HOROVOD_"))}
    env.update(extra)
    return env


def hora_run(*args: str, env: dict[str, str] | None = None, timeout: float = 60, **kw: Any):
    return subprocess.run([sys.executable, "-m", "hora", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env=clean_env() if env is None else env, **kw)


def show_config(*flags: str, env: dict[str, str] | None = None, overrides: tuple[str, ...] = (), np: int = 1,
                **kw: Any) -> list[dict[str, Any]]:
    """Run tests/scripts/show_config.py under ``hora run`` and return each rank's engine settings."""
    proc = hora_run("-np", str(np), *flags, sys.executable, str(SHOW_CONFIG), *overrides, env=env, **kw)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        head, _, rest = line.partition("<stdout>: CONFIG ")
        if rest:
            out[int(head.strip("[]"))] = json.loads(rest)
    assert sorted(out) == list(range(np)), proc.stdout
    return [out[r] for r in range(np)]


def test_without_flags_or_environment_the_workers_get_the_defaults():
    assert show_config(np=2) == [DEFAULTS, DEFAULTS]


def test_every_flag_reaches_the_workers(tmp_path):
    [cfg] = show_config(
        "--fusion-threshold-mb", "0.5",
        "--cycle-time-ms", "2.5",
        "--cache-capacity", "0",
        "--timeline-filename", "timeline.json",
        "--timeline-mark-cycles",
        "--no-stall-check",
        "--stall-check-warning-time-seconds", "15",
        "--stall-check-shutdown-time-seconds", "45",
        cwd=tmp_path,
    )
    assert cfg == {
        "fusion_threshold": 512 * 1024,
        "cycle_time_ms": 2.5,
        "cache_capacity": 0,
        "stall_check_disable": True,
        "stall_check_time": 15.0,
        "stall_shutdown_time": 45.0,
        "timeline": str(tmp_path / "timeline.json"),  # absolute, against the launcher's directory
        "timeline_mark_cycles": True,
    }


@pytest.mark.parametrize("name", ["HORA_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"])
def test_the_flag_beats_the_environment(name):
    [cfg] = show_config("--fusion-threshold-mb", "2", env=clean_env(**{name: "12345"}))
    assert cfg["fusion_threshold"] == 2 * 1024 * 1024


def test_the_environment_applies_without_the_flag():
    env = clean_env(HOROVOD_FUSION_THRESHOLD="12345", HOROVOD_CYCLE_TIME="7", HOROVOD_STALL_CHECK_DISABLE="1",
                    HOROVOD_TIMELINE="/tmp/horovod-timeline.json")
    [cfg] = show_config(env=env)
    assert cfg == {**DEFAULTS, "fusion_threshold": 12345, "cycle_time_ms": 7.0, "stall_check_disable": True,
                   "timeline": "/tmp/horovod-timeline.json"}


def test_the_hora_name_beats_the_horovod_alias_in_the_workers():
    [cfg] = show_config(env=clean_env(HORA_CACHE_CAPACITY="8", HOROVOD_CACHE_CAPACITY="9"))
    assert cfg["cache_capacity"] == 8


def test_an_argument_beats_the_flag():
    # show_config.py passes name=value to Config.resolve(overrides=...), as hvd.init(name=value) does
    env = clean_env(HOROVOD_FUSION_THRESHOLD="1")
    [cfg] = show_config("--fusion-threshold-mb", "2", overrides=("fusion_threshold=4096",), env=env)
    assert cfg["fusion_threshold"] == 4096


def test_an_empty_timeline_flag_turns_off_the_environments_timeline():
    [cfg] = show_config("--timeline-filename", "", env=clean_env(HOROVOD_TIMELINE="/tmp/t.json"))
    assert cfg["timeline"] == ""


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
def test_invalid_flag_values_are_clear_errors(flag, value, reason):
    proc = hora_run("-np", "1", flag, value, sys.executable, "-c", "pass")
    assert proc.returncode == 2, proc.stderr
    assert f"argument {flag}: {value!r} is not valid: {reason}" in proc.stderr
    assert "Traceback" not in proc.stderr


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
def test_invalid_environment_stops_the_launcher_before_any_rank_starts(tmp_path, name, value):
    marker = tmp_path / "started"
    proc = hora_run("-np", "2", sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=clean_env(**{name: value}))
    assert proc.returncode == 2, proc.stderr
    assert f"hora run: invalid hora settings:\n  {name}={value!r} is not valid" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_stall_shutdown_flag_below_the_warning_time_is_refused():
    proc = hora_run("-np", "1", "--stall-check-warning-time-seconds", "30",
                    "--stall-check-shutdown-time-seconds", "10", sys.executable, "-c", "pass")
    assert proc.returncode == 2, proc.stderr
    assert "--stall-check-shutdown-time-seconds 10 is less than --stall-check-warning-time-seconds 30" in proc.stderr
    assert "--stall-check-shutdown-time-seconds sets HORA_STALL_SHUTDOWN_TIME_SECONDS" in proc.stderr
    assert "--stall-check-warning-time-seconds sets HORA_STALL_CHECK_TIME_SECONDS" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_stall_shutdown_flag_is_judged_against_the_environment():
    # alone, 10 s is below the default warning time; the environment lowers that to 5 s, which makes it valid
    [cfg] = show_config("--stall-check-shutdown-time-seconds", "10",
                        env=clean_env(HOROVOD_STALL_CHECK_TIME_SECONDS="5"))
    assert (cfg["stall_check_time"], cfg["stall_shutdown_time"]) == (5.0, 10.0)
    # and a warning-time flag above the environment's shutdown time is refused
    proc = hora_run("-np", "1", "--stall-check-warning-time-seconds", "20", sys.executable, "-c", "pass",
                    env=clean_env(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="10"))
    assert proc.returncode == 2, proc.stderr
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=10 is less than HORA_STALL_CHECK_TIME_SECONDS=20" in proc.stderr


def test_help_lists_the_engine_flags():
    proc = hora_run("--help")
    assert proc.returncode == 0, proc.stderr
    for flag in ["--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity", "--timeline-filename",
                 "--timeline-mark-cycles", "--no-stall-check", "--stall-check-warning-time-seconds",
                 "--stall-check-shutdown-time-seconds", "--log-level"]:
        assert flag in proc.stdout
    for name in ["HORA_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_GLOO_TIMEOUT_SECONDS"]:
        assert name in proc.stdout


@pytest.mark.parametrize("port", ["-1", "70000", "http"])
def test_a_rendezvous_port_out_of_range_is_a_usage_error(port):
    proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "1", "--rendezvous-port", port, "true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not a port number" in proc.stderr and "0-65535" in proc.stderr


def test_a_command_that_is_not_executable_is_a_sentence_and_126(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")
    script.chmod(0o644)
    proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", str(script)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 126 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot start {str(script)!r}: Permission denied (is it an executable file?" in proc.stderr
