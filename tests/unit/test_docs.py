"""The documentation names every setting and every variable a worker receives."""

from __future__ import annotations

import dataclasses

from hora.config import Config
from hora.config.settings import settings_with_flags
from hora.config.variables import VARIABLES
from hora.config.worker_env import WORKER_VARIABLES, worker_env
from support import paths

DOCS = paths.DOCS


def test_every_setting_is_documented():
    text = (DOCS / "configuration.md").read_text()
    for f in dataclasses.fields(Config):
        for name in f.metadata["env"]:
            assert f"`{name}`" in text, f"{name} is missing from docs/configuration.md"


def test_every_worker_variable_is_documented():
    text = (DOCS / "launchers.md").read_text()
    env = worker_env(
        {}, rank=1, size=2, local_rank=1, local_size=2, cross_rank=0, cross_size=1, host="localhost",
        rendezvous=("127.0.0.1", 1234), secret=b"s" * 32, job_id="job", master_addr="127.0.0.1", master_port=4321,
        bind_addr="10.0.0.7", cpus=4,
    )  # fmt: skip
    declared = {name for v in WORKER_VARIABLES for name in v.names}
    assert set(env) == declared, "worker_env writes exactly the variables of the contract table"
    for name in env:
        assert f"`{name}" in text, f"{name} is missing from the table in docs/launchers.md"


def test_every_hora_run_flag_is_documented_with_its_setting():
    text = (DOCS / "configuration.md").read_text()
    for setting, flag, _ in settings_with_flags():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{setting}` |")), "")
        assert flag.name in row, f"{flag.name} is missing from {setting}'s row in docs/configuration.md"


def test_every_other_variable_hora_reads_is_documented():
    text = (DOCS / "configuration.md").read_text()
    for variable in VARIABLES:
        assert f"`{variable.name}`" in text, f"{variable.name} is missing from docs/configuration.md"


def test_the_hora_run_synopsis_lists_every_flag():
    text = (DOCS / "launchers.md").read_text()
    synopsis = text[text.index("```\nhora run -np N") : text.index("COMMAND ...")]
    for _, flag, _ in settings_with_flags():
        assert flag.name.removeprefix("--") in synopsis, f"{flag.name} is missing from the synopsis in docs/launchers.md"
