"""The consistency setting's spellings."""

from __future__ import annotations

import pytest

from hora.config import Config
from hora.errors import ConfigError
from hora.ps.client import parse_consistency


def test_spellings():
    assert parse_consistency("async") == ("async", 0)
    assert parse_consistency("SYNC") == ("sync", 0)
    assert parse_consistency("bounded(3)") == ("bounded", 3)
    assert parse_consistency("bounded:2") == ("bounded", 2)
    assert parse_consistency("bounded", staleness=4) == ("bounded", 4)
    for bad in ("bounded", "eventual", "bounded(-1)", "bounded(x)"):
        with pytest.raises(ConfigError):
            parse_consistency(bad)


def test_settings():
    config = Config.resolve(env={"HORA_PS_CONSISTENCY": "Bounded:3", "HORA_NUM_PS": "2", "HORA_STRATEGY": "parameter_server"})
    assert (config.ps_consistency, config.num_ps, config.strategy) == ("bounded(3)", 2, "parameter_server")
    with pytest.raises(ConfigError, match="HORA_PS_CONSISTENCY"):
        Config.resolve(env={"HORA_PS_CONSISTENCY": "eventually"})


def test_hora_run_flags():
    from hora.runner.flags import parse_run_options, settings_from_args

    args = parse_run_options(["-np", "2", "--num-ps", "2", "--strategy", "parameter_server", "--ps-consistency", "bounded(2)"])
    assert settings_from_args(args) == {"strategy": "parameter_server", "num_ps": 2, "ps_consistency": "bounded(2)"}
    with pytest.raises(ConfigError, match="--ps-consistency"):
        parse_run_options(["--ps-consistency", "often"])
