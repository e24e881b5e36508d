"""Config: defaults, parsing of every setting type from the environment, aliases, precedence and errors."""

from __future__ import annotations

import dataclasses

import pytest

from hora.config import Config, describe_settings, env_names, parse_value
from hora.config.parsers import parse_bool
from hora.errors import ConfigError


def test_defaults_without_environment():
    cfg = Config.resolve(env={})
    assert cfg == Config()
    assert cfg.start_timeout == 30.0
    assert cfg.op_timeout == 300.0
    assert cfg.transport == "auto"
    assert cfg.shm_chunk_bytes == 2 << 20
    assert cfg.tcp_chunk_bytes == 1 << 20
    assert cfg.max_frame_bytes == 64 << 20
    assert cfg.fusion_threshold == 64 * 1024 * 1024
    assert cfg.cycle_time_ms == 1.0
    assert cfg.cache_capacity == 1024
    assert cfg.stall_check_disable is False
    assert cfg.stall_check_time == 60.0
    assert cfg.stall_shutdown_time == 1800.0  # Horovod's is 0 (never): a stalled job must end
    assert cfg.timeline == ""
    assert cfg.timeline_mark_cycles is False
    assert cfg.log_level == "WARNING"
    assert cfg.hostname == ""
    assert cfg.rendezvous_port == 0
    assert cfg.secret == ""
    assert cfg.attempt == 0


def test_unrelated_environment_is_ignored():
    assert Config.resolve(env={"PATH": "/bin", "HORA_UNKNOWN_THING": "x", "RANK": "3"}) == Config()


@pytest.mark.parametrize("text", ["1", "true", "TRUE", " yes ", "on", "y", "t"])
def test_bool_true_spellings(text):
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "off", "n", "f", "", "  "])
def test_bool_false_spellings(text):
    assert parse_bool(text) is False


def test_bool_rejects_other_text():
    with pytest.raises(ValueError, match=r"expected one of \[.*'true'.*\]"):
        parse_bool("maybe")


@pytest.mark.parametrize(("text", "value"), [("12.5", 12.5), ("1", 1.0), (" 0.25 ", 0.25), ("1e3", 1000.0)])
def test_positive_float(text, value):
    assert Config.resolve(env={"HORA_START_TIMEOUT": text}).start_timeout == value
    assert Config.resolve(env={"HORA_OP_TIMEOUT_SECONDS": text}).op_timeout == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0", "expected a finite number > 0"),
        ("-1", "expected a finite number > 0"),
        ("abc", "could not convert"),
        ("", "could not convert"),
    ],
)
def test_positive_float_rejects(text, reason):
    with pytest.raises(ConfigError, match=rf"HORA_START_TIMEOUT={text!r} is not valid: {reason}"):
        Config.resolve(env={"HORA_START_TIMEOUT": text})


def test_positive_float_rejects_nan():
    with pytest.raises(ConfigError, match="HORA_START_TIMEOUT"):
        Config.resolve(env={"HORA_START_TIMEOUT": "nan"})


@pytest.mark.parametrize("name", ["HORA_SHM_CHUNK_BYTES", "HORA_TCP_CHUNK_BYTES", "HORA_MAX_FRAME_BYTES"])
def test_positive_int(name):
    cfg = Config.resolve(env={name: "4096"})
    field = {
        "HORA_SHM_CHUNK_BYTES": "shm_chunk_bytes",
        "HORA_TCP_CHUNK_BYTES": "tcp_chunk_bytes",
        "HORA_MAX_FRAME_BYTES": "max_frame_bytes",
    }[name]
    assert getattr(cfg, field) == 4096


@pytest.mark.parametrize(
    ("text", "reason"),
    [("0", "expected a whole number > 0"), ("-5", "expected a whole number > 0"), ("1.5", "invalid literal")],
)
def test_positive_int_rejects(text, reason):
    with pytest.raises(ConfigError, match=rf"HORA_TCP_CHUNK_BYTES={text!r} is not valid: {reason}"):
        Config.resolve(env={"HORA_TCP_CHUNK_BYTES": text})


def test_plain_int_and_str():
    cfg = Config.resolve(env={"HORA_RENDEZVOUS_PORT": "29500", "HORA_ATTEMPT": "2", "HORA_JOB_ID": "job-7"})
    assert (cfg.rendezvous_port, cfg.attempt, cfg.job_id) == (29500, 2, "job-7")
    with pytest.raises(ConfigError, match=r"HORA_RENDEZVOUS_PORT='http' is not valid"):
        Config.resolve(env={"HORA_RENDEZVOUS_PORT": "http"})


@pytest.mark.parametrize(("text", "value"), [("shm", "shm"), (" TCP ", "tcp"), ("Auto", "auto")])
def test_choice(text, value):
    assert Config.resolve(env={"HORA_TRANSPORT": text}).transport == value


def test_choice_rejects():
    with pytest.raises(
        ConfigError, match=r"HORA_TRANSPORT='udp' is not valid: expected one of auto, shm, tcp"
    ):
        Config.resolve(env={"HORA_TRANSPORT": "udp"})


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("trace", "DEBUG"),
        ("debug", "DEBUG"),
        ("info", "INFO"),
        ("warn", "WARNING"),
        ("WARNING", "WARNING"),
        ("error", "ERROR"),
        ("fatal", "CRITICAL"),
        (" Critical ", "CRITICAL"),
    ],
)
def test_log_level_aliases(text, level):
    assert Config.resolve(env={"HORA_LOG_LEVEL": text}).log_level == level


def test_log_level_rejects():
    with pytest.raises(
        ConfigError, match=r"HORA_LOG_LEVEL='verbose' is not valid: expected one of trace, debug"
    ):
        Config.resolve(env={"HORA_LOG_LEVEL": "verbose"})


@pytest.mark.parametrize(
    ("horovod", "field", "text", "value"),
    [
        ("HOROVOD_START_TIMEOUT", "start_timeout", "45", 45.0),
        ("HOROVOD_LOG_LEVEL", "log_level", "trace", "DEBUG"),
        ("HOROVOD_HOSTNAME", "hostname", "node3", "node3"),
    ],
)
def test_horovod_alias_is_honoured(horovod, field, text, value):
    assert getattr(Config.resolve(env={horovod: text}), field) == value


@pytest.mark.parametrize(
    ("hora_name", "horovod", "field", "hora_text", "horovod_text", "value"),
    [
        ("HORA_START_TIMEOUT", "HOROVOD_START_TIMEOUT", "start_timeout", "7", "45", 7.0),
        ("HORA_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "log_level", "error", "trace", "ERROR"),
        ("HORA_HOSTNAME", "HOROVOD_HOSTNAME", "hostname", "mine", "theirs", "mine"),
    ],
)
def test_hora_name_wins_over_horovod_alias(hora_name, horovod, field, hora_text, horovod_text, value):
    env = {horovod: horovod_text, hora_name: hora_text}  # HOROVOD_* first in iteration order on purpose
    assert getattr(Config.resolve(env=env), field) == value


def test_invalid_horovod_alias_is_not_read_when_hora_name_is_set():
    cfg = Config.resolve(env={"HORA_START_TIMEOUT": "7", "HOROVOD_START_TIMEOUT": "bogus"})
    assert cfg.start_timeout == 7.0


def test_invalid_horovod_alias_is_reported_by_its_name():
    with pytest.raises(ConfigError, match=r"HOROVOD_LOG_LEVEL='loud' is not valid"):
        Config.resolve(env={"HOROVOD_LOG_LEVEL": "loud"})


def test_env_names():
    assert env_names("start_timeout") == ("HORA_START_TIMEOUT", "HOROVOD_START_TIMEOUT")
    assert env_names("transport") == ("HORA_TRANSPORT",)
    with pytest.raises(KeyError):
        env_names("no_such_setting")


def test_describe_settings_lists_every_variable():
    text = describe_settings()
    for f in dataclasses.fields(Config):
        for name in f.metadata["env"]:
            assert name in text


def test_explicit_override_beats_environment():
    env = {"HORA_START_TIMEOUT": "5", "HOROVOD_LOG_LEVEL": "debug", "HORA_TRANSPORT": "shm"}
    cfg = Config.resolve(env=env, overrides={"start_timeout": 9.0, "log_level": "ERROR"})
    assert cfg.start_timeout == 9.0
    assert cfg.log_level == "ERROR"
    assert cfg.transport == "shm"  # not overridden: the environment still applies


def test_override_of_none_keeps_environment_value():
    cfg = Config.resolve(env={"HORA_START_TIMEOUT": "5"}, overrides={"start_timeout": None})
    assert cfg.start_timeout == 5.0


def test_invalid_environment_is_reported_even_when_overridden():
    # The environment is parsed before overrides apply; a broken variable is an error even if overridden.
    with pytest.raises(ConfigError, match="HORA_START_TIMEOUT='x'"):
        Config.resolve(env={"HORA_START_TIMEOUT": "x"}, overrides={"start_timeout": 3.0})


def test_all_problems_in_one_error():
    env = {
        "HORA_START_TIMEOUT": "-3",
        "HORA_TRANSPORT": "udp",
        "HORA_LOG_LEVEL": "loud",
        "HORA_SHM_CHUNK_BYTES": "big",
    }
    with pytest.raises(ConfigError) as info:
        Config.resolve(env=env, overrides={"start_timout": 5, "transport": "tcp"})
    message = str(info.value)
    assert message.startswith("invalid hora settings:\n  ")
    lines = message.splitlines()[1:]
    assert len(lines) == 5
    assert "HORA_START_TIMEOUT='-3' is not valid: expected a finite number > 0" in message
    assert "HORA_TRANSPORT='udp' is not valid: expected one of auto, shm, tcp" in message
    assert "HORA_LOG_LEVEL='loud' is not valid" in message
    assert "HORA_SHM_CHUNK_BYTES='big' is not valid" in message
    assert "unknown setting 'start_timout'; known settings: " in message
    assert "start_timeout" in message.split("known settings: ")[1]


def test_unknown_override_alone():
    with pytest.raises(ConfigError, match=r"unknown setting 'bogus'; known settings: attempt, autotune, "):
        Config.resolve(env={}, overrides={"bogus": 1})


@pytest.mark.parametrize(
    ("key", "value", "normalized"),
    [
        ("transport", "TCP", "tcp"),
        ("transport", "udp", None),
        ("start_timeout", -1.0, None),
        ("log_level", "trace", "DEBUG"),
    ],
)
def test_overrides_are_validated_like_the_environment(key, value, normalized):
    try:
        cfg = Config.resolve(env={}, overrides={key: value})
    except ConfigError:
        return
    assert normalized is not None and getattr(cfg, key) == normalized


def _non_default_config() -> Config:
    return Config(
        start_timeout=12.5,
        elastic_timeout=45.0,
        grace_period=7.5,
        oversubscribe=True,
        merge_stderr=True,
        record=True,
        op_timeout=60.25,
        thread_defaults=False,
        transport="tcp",
        hierarchical_allreduce=False,
        hierarchical_allgather=False,
        shm_chunk_bytes=4096,
        tcp_chunk_bytes=8192,
        max_frame_bytes=1 << 16,
        fusion_threshold=0,
        bucket_cap=3 * 2**20,
        cycle_time_ms=2.5,
        cache_capacity=0,
        stall_check_disable=True,
        stall_check_time=30.0,
        stall_shutdown_time=90.0,
        timeline="/tmp/hora-timeline.json",
        timeline_mark_cycles=True,
        system_metrics="/tmp/hora-system-metrics.jsonl",
        system_metrics_interval=0.1,
        autotune=True,
        autotune_log_file="/tmp/hora-autotune.csv",
        autotune_warmup_samples=1,
        autotune_steps_per_sample=4,
        autotune_bayes_opt_max_samples=7,
        autotune_gaussian_process_noise=0.25,
        strategy="parameter_server",
        num_ps=2,
        ps_per_host=1,
        ps_consistency="bounded(3)",
        ps_max_restarts=2,
        ps_checkpoint_dir="/tmp/hora-ps-ckpt",
        ps_checkpoint_steps=7,
        ps_single_copy=False,
        log_level="DEBUG",
        hostname="node7",
        rendezvous_addr="10.0.0.1",
        rendezvous_port=29500,
        secret="ab" * 32,
        secret_file="/tmp/hora-secret",
        job_id="job42",
        attempt=3,
        bind_addr="10.0.0.2",
        port_range="29500-29600",
        runtime_dir="/tmp/hora-test-runtime",
    )


def test_to_env_round_trip():
    cfg = _non_default_config()
    for f in dataclasses.fields(Config):  # a new setting must be added to _non_default_config
        assert getattr(cfg, f.name) != f.default, f.name
    env = cfg.to_env()
    assert all(k.startswith("HORA_") for k in env)
    assert all(isinstance(v, str) for v in env.values())
    assert Config.resolve(env=env) == cfg


def test_to_env_of_defaults_is_empty():
    assert Config().to_env() == {}


def test_public_dict_hides_secret():
    cfg = _non_default_config()
    public = cfg.public_dict()
    assert public["secret"] == "<hidden>"
    assert "ab" * 32 not in repr(public)
    assert public["job_id"] == "job42"
    assert cfg.secret == "ab" * 32  # the config itself still holds it
    assert Config().public_dict()["secret"] == ""


def test_to_env_renders_bools_as_digits():
    env = Config(stall_check_disable=True, timeline_mark_cycles=True).to_env()
    assert env == {"HORA_STALL_CHECK_DISABLE": "1", "HORA_TIMELINE_MARK_CYCLES": "1"}


def test_public_dict_has_the_engine_settings():
    public = _non_default_config().public_dict()
    assert public["fusion_threshold"] == 0
    assert public["stall_check_disable"] is True
    assert public["timeline"] == "/tmp/hora-timeline.json"


# --- engine settings -------------------------------------------------------------------------------------------

# setting, HORA_* name, HOROVOD_* alias, a valid text, the value it gives
ENGINE = [
    ("fusion_threshold", "HORA_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "1048576", 1 << 20),
    ("cycle_time_ms", "HORA_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "3.5", 3.5),
    ("cache_capacity", "HORA_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "16", 16),
    ("stall_check_disable", "HORA_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE", "1", True),
    ("stall_check_time", "HORA_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS", "12", 12.0),
    ("stall_shutdown_time", "HORA_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120", 120.0),
    ("timeline", "HORA_TIMELINE", "HOROVOD_TIMELINE", "/tmp/t.json", "/tmp/t.json"),
    ("timeline_mark_cycles", "HORA_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", "true", True),
    ("op_timeout", "HORA_OP_TIMEOUT_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS", "45", 45.0),
]
ENGINE_IDS = [row[0] for row in ENGINE]


@pytest.mark.parametrize(("field", "hora_name", "horovod", "text", "value"), ENGINE, ids=ENGINE_IDS)
def test_engine_env_names(field, hora_name, horovod, text, value):
    assert env_names(field) == (hora_name, horovod)


@pytest.mark.parametrize(("field", "hora_name", "horovod", "text", "value"), ENGINE, ids=ENGINE_IDS)
def test_engine_setting_from_hora_name(field, hora_name, horovod, text, value):
    cfg = Config.resolve(env={hora_name: text})
    assert getattr(cfg, field) == value
    assert type(getattr(cfg, field)) is type(value)


@pytest.mark.parametrize(("field", "hora_name", "horovod", "text", "value"), ENGINE, ids=ENGINE_IDS)
def test_engine_setting_from_horovod_alias(field, hora_name, horovod, text, value):
    assert getattr(Config.resolve(env={horovod: text}), field) == value


@pytest.mark.parametrize(("field", "hora_name", "horovod", "text", "value"), ENGINE, ids=ENGINE_IDS)
def test_engine_setting_hora_name_wins(field, hora_name, horovod, text, value):
    default = getattr(Config(), field)
    default_text = {bool: "0", str: ""}.get(type(default), str(default))
    # the HORA_* name holds the default, the alias another value (and comes first in the mapping): HORA_* wins
    assert getattr(Config.resolve(env={horovod: text, hora_name: default_text}), field) == default
    # and the alias is not even parsed when the HORA_* name is set
    assert getattr(Config.resolve(env={hora_name: text, horovod: "bogus"}), field) == value


@pytest.mark.parametrize(("field", "hora_name", "horovod", "text", "value"), ENGINE, ids=ENGINE_IDS)
def test_engine_setting_argument_beats_environment(field, hora_name, horovod, text, value):
    default = getattr(Config(), field)
    assert getattr(Config.resolve(env={hora_name: text}, overrides={field: default}), field) == default
    assert getattr(Config.resolve(env={horovod: text}, overrides={field: default}), field) == default


@pytest.mark.parametrize(
    ("field", "text", "reason"),
    [
        ("fusion_threshold", "-1", "expected a whole number >= 0"),
        ("fusion_threshold", "1.5", "invalid literal"),
        ("fusion_threshold", "64MB", "invalid literal"),
        ("cycle_time_ms", "-0.5", "expected a finite number >= 0"),
        ("cycle_time_ms", "nan", "expected a finite number >= 0"),
        ("cycle_time_ms", "inf", "expected a finite number >= 0"),
        ("cycle_time_ms", "fast", "could not convert"),
        ("cache_capacity", "-3", "expected a whole number >= 0"),
        ("cache_capacity", "lots", "invalid literal"),
        ("stall_check_disable", "maybe", "expected one of"),
        ("stall_check_time", "0", "expected a finite number > 0"),
        ("stall_check_time", "-60", "expected a finite number > 0"),
        ("stall_check_time", "inf", "expected a finite number > 0"),
        ("stall_shutdown_time", "-1", "expected a finite number >= 0"),
        ("stall_shutdown_time", "nan", "expected a finite number >= 0"),
        ("timeline_mark_cycles", "2", "expected one of"),
        ("op_timeout", "0", "expected a finite number > 0"),
    ],
)
def test_engine_setting_rejects(field, text, reason):
    for name in env_names(field):
        with pytest.raises(ConfigError, match=rf"{name}={text!r} is not valid: {reason}"):
            Config.resolve(env={name: text})
    with pytest.raises(ConfigError, match=rf"{field}={text!r} is not valid: {reason}"):
        Config.resolve(env={}, overrides={field: text})
    with pytest.raises(ValueError, match=reason):
        parse_value(field, text)


@pytest.mark.parametrize(
    ("field", "text", "value"),
    [
        ("fusion_threshold", "0", 0),
        ("fusion_threshold", " 67108864 ", 64 << 20),
        ("cycle_time_ms", "0", 0.0),
        ("cycle_time_ms", "-0", 0.0),
        ("cycle_time_ms", "0.1", 0.1),
        ("cache_capacity", "0", 0),
        ("stall_check_time", "0.5", 0.5),
        ("stall_shutdown_time", "0", 0.0),
        ("stall_check_disable", "yes", True),
        ("stall_check_disable", "0", False),
        ("timeline", "", ""),
        ("timeline", "relative/t.json", "relative/t.json"),
    ],
)
def test_engine_setting_edge_values(field, text, value):
    assert getattr(Config.resolve(env={env_names(field)[0]: text}), field) == value


@pytest.mark.parametrize("field", ["stall_check_disable", "timeline_mark_cycles"])
@pytest.mark.parametrize(("given", "value"), [(True, True), (False, False), ("1", True), (0, False), ("on", True)])
def test_bool_setting_round_trips_through_overrides(field, given, value):
    env = {env_names(field)[0]: "0" if value else "1"}  # the argument must beat the environment either way
    assert getattr(Config.resolve(env=env, overrides={field: given}), field) is value


def test_env_for_renders_bools_as_digits_and_is_read_back():
    settings = {"stall_check_disable": True, "timeline_mark_cycles": False, "fusion_threshold": 2 << 20}
    env = Config.env_for(settings)
    assert env == {
        "HORA_STALL_CHECK_DISABLE": "1",
        "HORA_TIMELINE_MARK_CYCLES": "0",
        "HORA_FUSION_THRESHOLD": "2097152",
    }
    cfg = Config.resolve(env={**env, "HOROVOD_STALL_CHECK_DISABLE": "0", "HOROVOD_FUSION_THRESHOLD": "7"})
    assert (cfg.stall_check_disable, cfg.timeline_mark_cycles, cfg.fusion_threshold) == (True, False, 2 << 20)


def test_env_for_validates():
    with pytest.raises(ConfigError, match=r"cycle_time_ms=-1 is not valid"):
        Config.env_for({"cycle_time_ms": -1})


# --- the stall times against each other -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HORA_STALL_SHUTDOWN_TIME_SECONDS": "30"}, ["HORA_STALL_SHUTDOWN_TIME_SECONDS=30", "default"]),
        (
            {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5", "HOROVOD_STALL_CHECK_TIME_SECONDS": "10"},
            ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=5", "HOROVOD_STALL_CHECK_TIME_SECONDS=10"],
        ),
        (
            {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "9.5", "HORA_STALL_CHECK_TIME_SECONDS": "10"},
            ["HORA_STALL_SHUTDOWN_TIME_SECONDS=9.5", "HORA_STALL_CHECK_TIME_SECONDS=10"],
        ),
    ],
)
def test_stall_shutdown_time_below_check_time_is_rejected(env, named):
    with pytest.raises(ConfigError) as info:
        Config.resolve(env=env)
    message = str(info.value)
    for text in named:
        assert text in message
    # whichever names were used, the message names both variables and the way out
    assert "HORA_STALL_SHUTDOWN_TIME_SECONDS" in message and "HORA_STALL_CHECK_TIME_SECONDS" in message
    assert "set the shutdown time to 0" in message


@pytest.mark.parametrize(
    "env",
    [
        {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "0"},
        {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "60"},  # equal to the default check time
        {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "61"},
        {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "10", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5"},
    ],
)
def test_stall_shutdown_time_accepted(env):
    Config.resolve(env=env)


def test_the_default_stall_shutdown_follows_a_longer_check_time():
    from hora._engine.settings import EngineSettings

    cfg = Config.resolve(env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "3600"})  # not refused: the default follows
    assert EngineSettings(cfg).stall_shutdown_time == 3600.0
    assert EngineSettings(Config.resolve(env={})).stall_shutdown_time == 1800.0
    assert EngineSettings(Config.resolve(env={"HORA_STALL_SHUTDOWN_TIME_SECONDS": "0"})).stall_shutdown_time == 0.0


def test_stall_check_by_argument():
    with pytest.raises(ConfigError, match=r"stall_shutdown_time=5 is less than stall_check_time=7\.5"):
        Config.resolve(env={}, overrides={"stall_shutdown_time": 5, "stall_check_time": 7.5})
    # an argument can also repair what the environment says
    cfg = Config.resolve(env={"HORA_STALL_SHUTDOWN_TIME_SECONDS": "30"}, overrides={"stall_check_time": 20})
    assert (cfg.stall_check_time, cfg.stall_shutdown_time) == (20.0, 30.0)


def test_stall_check_is_not_confused_by_an_invalid_value():
    with pytest.raises(ConfigError) as info:
        Config.resolve(env={"HORA_STALL_CHECK_TIME_SECONDS": "x", "HORA_STALL_SHUTDOWN_TIME_SECONDS": "10"})
    assert str(info.value).splitlines()[1:] == [
        "  HORA_STALL_CHECK_TIME_SECONDS='x' is not valid: could not convert string to float: 'x'"
    ]


def test_env_for_checks_only_stall_times_given_together():
    # the workers may inherit HORA_STALL_CHECK_TIME_SECONDS=5: the launcher cannot judge 10 alone
    assert Config.env_for({"stall_shutdown_time": 10}) == {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "10.0"}
    with pytest.raises(ConfigError, match="stall_shutdown_time=10 is less than stall_check_time=20"):
        Config.env_for({"stall_shutdown_time": 10, "stall_check_time": 20})


@pytest.mark.parametrize(("text", "value"), [("", ""), ("29500-29600", "29500-29600"), (" 4000 ", "4000-4000")])
def test_port_range(text, value):
    assert Config.resolve(env={"HORA_PORT_RANGE": text}).port_range == value


@pytest.mark.parametrize("text", ["29600-29500", "0-10", "1-70000", "a-b", "1-2-3"])
def test_bad_port_range_is_a_clear_error(text):
    with pytest.raises(ConfigError, match=r"HORA_PORT_RANGE=.* is not valid: expected LOW-HIGH"):
        Config.resolve(env={"HORA_PORT_RANGE": text})


def test_autotune_settings_take_horovods_names_and_follow_the_precedence():
    env = {
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "/tmp/a.csv",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "5",
        "HORA_AUTOTUNE_WARMUP_SAMPLES": "2",  # the HORA_* name wins over its alias
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "6",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "9",
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5",
    }
    cfg = Config.resolve(env=env, overrides={"autotune_steps_per_sample": 3})  # an argument beats both
    assert cfg.autotune and cfg.autotune_log_file == "/tmp/a.csv"
    assert (cfg.autotune_warmup_samples, cfg.autotune_steps_per_sample) == (2, 3)
    assert (cfg.autotune_bayes_opt_max_samples, cfg.autotune_gaussian_process_noise) == (9, 0.5)
    defaults = Config.resolve(env={})
    assert not defaults.autotune and defaults.autotune_log_file == ""
    assert (defaults.autotune_warmup_samples, defaults.autotune_steps_per_sample) == (3, 10)
    assert (defaults.autotune_bayes_opt_max_samples, defaults.autotune_gaussian_process_noise) == (20, 0.8)
    with pytest.raises(ConfigError, match="HORA_AUTOTUNE_STEPS_PER_SAMPLE='0'"):
        Config.resolve(env={"HORA_AUTOTUNE_STEPS_PER_SAMPLE": "0"})
