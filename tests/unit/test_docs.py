"""The documentation names every setting and every variable a worker receives."""

from __future__ import annotations

import dataclasses
import re

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


def _horovod_names() -> tuple[set[str], set[str]]:
    """(the HOROVOD_* variables hora reads as aliases of its settings, those hora run writes for every rank)."""
    settings = {n for f in dataclasses.fields(Config) for n in f.metadata["env"] if n.startswith("HOROVOD_")}
    settings |= {v.name for v in VARIABLES if v.name.startswith("HOROVOD_")}
    written = {n for v in WORKER_VARIABLES for n in v.names if n.startswith("HOROVOD_")}
    return settings, written


def test_the_readme_lists_exactly_the_horovod_variables_hora_reads():
    text = (DOCS.parent / "README.md").read_text()
    section = text[text.index("## Horovod variables") :]
    section = section[: section.index("\n## ")]
    honoured, other = section.split("Horovod's other variables are not read")
    read, written = _horovod_names()
    listed = set(re.findall(r"`(HOROVOD_\w+)`", honoured))
    missing, unknown = sorted(read | written - listed), sorted(listed - read - written)
    assert listed == read | written, f"missing: {missing}; listed but not read or written: {unknown}"
    assert not set(re.findall(r"`(HOROVOD_\w+)`", other)) & (read | written)


def test_no_doc_names_a_horovod_variable_hora_ignores_as_if_it_worked():
    read, written = _horovod_names()
    for md in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        for n, line in enumerate(md.read_text().splitlines(), 1):
            if "not read" in line:
                continue
            unknown = set(re.findall(r"HOROVOD_[A-Z0-9_]+", line)) - read - written
            assert not unknown, f"{md.name}:{n} names {sorted(unknown)}, which hora does not read: {line}"


def test_each_settings_row_names_all_its_variables():
    text = (DOCS / "configuration.md").read_text()
    for f in dataclasses.fields(Config):
        row = next((line for line in text.splitlines() if line.startswith(f"| `{f.name}` |")), "")
        assert row, f"{f.name} has no row in docs/configuration.md"
        for name in f.metadata["env"]:
            assert f"`{name}`" in row, f"{name} is missing from {f.name}'s row in docs/configuration.md"
