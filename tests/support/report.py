"""Running tests/support/scripts/report.py as the ranks of a launcher and reading what each rank reports."""

from __future__ import annotations

import os
import re
import sys

from support import paths

__all__ = ["FOREIGN", "REPORT", "clean_env", "expect", "parse"]

REPORT = str(paths.SCRIPTS / "report.py")
FOREIGN = ("HORA_", "HOROVOD_", "OMPI_", "PMIX_", "SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def parse(out: str) -> dict[int, dict[str, str]]:
    results = {}
    for m in re.finditer(r"RESULT rank=(\d+) size=(\d+) local=(\d+)/(\d+) cross=(\d+)/(\d+) sum=(\d+)", out):
        results[int(m[1])] = dict(zip(["size", "local_rank", "local_size", "cross_rank", "cross_size", "sum"], m.groups()[1:]))
    return results


def expect(results: dict[int, dict[str, str]], n: int) -> None:
    assert sorted(results) == list(range(n)), results
    for r, got in results.items():
        assert got == {"size": str(n), "local_rank": str(r), "local_size": str(n), "cross_rank": "0",
                       "cross_size": "1", "sum": str(n * (n - 1) // 2)}, got
