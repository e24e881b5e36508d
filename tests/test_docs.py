"""The documentation names every setting and every variable a worker receives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hora.config import Config
from hora.runner.launch import LaunchSpec, worker_env

DOCS = Path(__file__).parent.parent / "docs"


def test_every_setting_is_documented():
    text = (DOCS / "configuration.md").read_text()
    for f in dataclasses.fields(Config):
        for name in f.metadata["env"]:
            assert f"`{name}`" in text, f"{name} is missing from docs/configuration.md"


def test_every_worker_variable_is_documented():
    text = (DOCS / "launchers.md").read_text()
    env = worker_env(LaunchSpec(["true"], 2, env={}), 1, ("127.0.0.1", 1234), b"s" * 32, "job", 4321)
    for name in env:
        assert f"`{name}" in text, f"{name} is missing from the table in docs/launchers.md"
