"""hora run's command line is generated from the settings' declarations: every flag's help states the setting's
real default and variable, parsed flags become settings, and bad values are refused like the variable's."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from hora.config import Config, env_names
from hora.config.launchers import without_launcher_variables
from hora.config.settings import settings_with_flags
from hora.config.worker_env import worker_env
from hora.errors import ConfigError
from hora.runner.flags import (
    LAUNCHER_OPTIONS,
    add_run_arguments,
    check_settings,
    flag_table,
    help_text,
    parse_run_options,
    settings_from_args,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hora run")
    add_run_arguments(parser)
    return parser


def test_every_flag_is_on_the_command_line_and_states_its_default_and_variable():
    help_out = " ".join(_parser().format_help().split())  # argparse wraps lines
    for setting, flag, default in settings_with_flags():
        assert flag.name in help_out
        text = " ".join(help_text(setting, flag, default).split())
        assert text in help_out, f"{flag.name}: {text!r}"
        assert env_names(setting)[0] in text
        if flag.action != "store_true":
            assert "(default " in text


def test_help_defaults_follow_the_declarations():
    texts = {s: help_text(s, f, d) for s, f, d in settings_with_flags()}
    assert "(default 64; HORA_FUSION_THRESHOLD, in bytes)" in texts["fusion_threshold"]
    assert f"(default {Config().cycle_time_ms:g}; HORA_CYCLE_TIME)" in texts["cycle_time_ms"]
    assert "(default on; HORA_HIERARCHICAL_ALLREDUCE)" in texts["hierarchical_allreduce"]
    assert "(default none; HORA_TIMELINE)" in texts["timeline"]


def test_flags_become_settings():
    args = parse_run_options([
        "--fusion-threshold-mb", "32", "--no-hierarchical-allreduce", "--transport", "tcp", "--no-stall-check",
        "--cycle-time-ms", "2.5", "--log-level", "debug",
    ])  # fmt: skip
    assert settings_from_args(args) == {
        "fusion_threshold": 32 << 20,
        "hierarchical_allreduce": False,
        "transport": "tcp",
        "stall_check_disable": True,
        "cycle_time_ms": 2.5,
        "log_level": "debug",
    }
    assert Config.env_for(settings_from_args(args))["HORA_LOG_LEVEL"] == "DEBUG"


def test_flags_not_given_leave_the_setting_to_the_environment():
    assert settings_from_args(parse_run_options([])) == {}


def test_an_empty_timeline_stays_empty_and_a_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert settings_from_args(parse_run_options(["--timeline-filename", ""])) == {"timeline": ""}
    got = settings_from_args(parse_run_options(["--timeline-filename", "t.json"]))
    assert got == {"timeline": str(tmp_path / "t.json")}


def test_autotune_flags_become_horovods_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = parse_run_options([
        "--autotune", "--autotune-log-file", "at.csv", "--autotune-warmup-samples", "0",
        "--autotune-steps-per-sample", "5", "--autotune-bayes-opt-max-samples", "12",
        "--autotune-gaussian-process-noise", "0.1",
    ])  # fmt: skip
    settings = settings_from_args(args)
    assert settings == {
        "autotune": True,
        "autotune_log_file": str(tmp_path / "at.csv"),  # the workers may run elsewhere: made absolute here
        "autotune_warmup_samples": 0,
        "autotune_steps_per_sample": 5,
        "autotune_bayes_opt_max_samples": 12,
        "autotune_gaussian_process_noise": 0.1,
    }
    env = Config.env_for(settings)
    assert env["HORA_AUTOTUNE"] == "1" and env["HORA_AUTOTUNE_LOG"] == str(tmp_path / "at.csv")


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--cycle-time-ms", "-1"], "argument --cycle-time-ms: '-1' is not valid: expected a finite number >= 0"),
        (["--fusion-threshold-mb", "x"], "argument --fusion-threshold-mb: 'x' is not valid"),
        (["--transport", "udp"], "argument --transport: invalid choice: 'udp'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_flags_are_refused_with_the_reason(words, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_run_options(words)


def test_the_launcher_options_are_parsed_apart_from_the_settings():
    args = parse_run_options(["-np", "4", "-H", "a:2,b:2", "--output-filename", "out"])
    assert (args.np, args.hosts, args.output_filename) == (4, "a:2,b:2", "out")
    assert set(LAUNCHER_OPTIONS) <= set(vars(args))
    assert settings_from_args(args) == {}


def test_a_bad_combination_names_the_flags():
    problem = check_settings({"stall_check_time": 30.0, "stall_shutdown_time": 10.0}, env={})
    assert "--stall-check-shutdown-time-seconds 10" in problem and "--stall-check-warning-time-seconds 30" in problem


def test_each_setting_has_one_flag_and_each_flag_one_setting():
    table = flag_table()
    assert len(set(table.values())) == len(table)


# What a rank of `hora run FLAGS` resolves, against the environment hora run was started in: the flags' settings
# (settings_from_args) are written over the launcher's environment as hora run writes a rank's (worker_env), and the
# rank reads them back (Config.resolve, with init()'s arguments as overrides). End to end, with real ranks, in
# tests/multiprocess/runner/test_flags.py.

ENGINE_DEFAULTS = {
    "fusion_threshold": 64 * 1024 * 1024,
    "cycle_time_ms": 1.0,
    "cache_capacity": 1024,
    "stall_check_disable": False,
    "stall_check_time": 60.0,
    "stall_shutdown_time": 1800.0,
    "timeline": "",
    "timeline_mark_cycles": False,
}


#: Where the rank is (what hora run's placement adds; no engine setting depends on it).
ONE_RANK: dict[str, Any] = {
    "rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "cross_rank": 0, "cross_size": 1, "host": "localhost",
    "rendezvous": ("127.0.0.1", 1), "secret": b"s" * 32, "job_id": "job", "master_addr": "127.0.0.1",
    "master_port": 2,
}


def workers_resolve(flags: list[str], env: dict[str, str] | None = None, **arguments: Any) -> dict[str, Any]:
    """The engine settings a rank of ``hora run FLAGS`` resolves when hora run's environment is ``env``."""
    settings = settings_from_args(parse_run_options(flags))
    assert check_settings(settings, env=env or {}) == ""
    rank_env = worker_env(without_launcher_variables(env or {}), settings=settings, **ONE_RANK)
    cfg = Config.resolve(env=rank_env, overrides=arguments)
    return {name: getattr(cfg, name) for name in ENGINE_DEFAULTS}


def test_without_flags_or_environment_the_workers_get_the_defaults():
    assert workers_resolve([]) == ENGINE_DEFAULTS


@pytest.mark.parametrize("name", ["HORA_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"])
def test_the_flag_beats_the_environment(name):
    assert workers_resolve(["--fusion-threshold-mb", "2"], {name: "12345"})["fusion_threshold"] == 2 * 1024 * 1024


def test_the_environment_applies_without_the_flag():
    env = {"HOROVOD_FUSION_THRESHOLD": "12345", "HOROVOD_CYCLE_TIME": "7", "HOROVOD_STALL_CHECK_DISABLE": "1",
           "HOROVOD_TIMELINE": "/tmp/horovod-timeline.json"}
    assert workers_resolve([], env) == {**ENGINE_DEFAULTS, "fusion_threshold": 12345, "cycle_time_ms": 7.0,
                                        "stall_check_disable": True, "timeline": "/tmp/horovod-timeline.json"}


def test_the_hora_name_beats_the_horovod_alias_in_the_workers():
    assert workers_resolve([], {"HORA_CACHE_CAPACITY": "8", "HOROVOD_CACHE_CAPACITY": "9"})["cache_capacity"] == 8


def test_an_argument_beats_the_flag():
    # hvd.init(fusion_threshold=4096) passes its arguments to Config.resolve(overrides=...)
    got = workers_resolve(["--fusion-threshold-mb", "2"], {"HOROVOD_FUSION_THRESHOLD": "1"}, fusion_threshold=4096)
    assert got["fusion_threshold"] == 4096


def test_an_empty_timeline_flag_turns_off_the_environments_timeline():
    assert workers_resolve(["--timeline-filename", ""], {"HOROVOD_TIMELINE": "/tmp/t.json"})["timeline"] == ""


def test_stall_shutdown_flag_is_judged_against_the_environment():
    # alone, 10 s is below the default warning time; the environment lowers that to 5 s, which makes it valid (the
    # refusal of a warning-time flag above the environment's shutdown time: tests/unit/test_cli.py)
    got = workers_resolve(["--stall-check-shutdown-time-seconds", "10"], {"HOROVOD_STALL_CHECK_TIME_SECONDS": "5"})
    assert (got["stall_check_time"], got["stall_shutdown_time"]) == (5.0, 10.0)
