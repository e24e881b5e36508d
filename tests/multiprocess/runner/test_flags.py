"""`hora run`'s engine-setting flags reach real ranks, over what the ranks would inherit from the environment.

The rest is pure logic, tested in this process: what the flags resolve to against the environment and init()'s
arguments (precedence, aliases, the empty timeline, stall times judged against the environment) in
tests/unit/runner/test_flags.py; bad flags, a bad environment, bad combinations, --help, --rendezvous-port and a
command that is not executable in tests/unit/test_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from support import paths

SHOW_CONFIG = paths.SCRIPTS / "show_config.py"

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
    """Run tests/support/scripts/show_config.py under ``hora run`` and return each rank's engine settings."""
    proc = hora_run("-np", str(np), *flags, sys.executable, str(SHOW_CONFIG), *overrides, env=env, **kw)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        head, _, rest = line.partition("<stdout>: CONFIG ")
        if rest:
            out[int(head.strip("[]"))] = json.loads(rest)
    assert sorted(out) == list(range(np)), proc.stdout
    return [out[r] for r in range(np)]


def test_every_flag_reaches_the_workers_over_the_environment(tmp_path):
    # every engine variable in the environment hora run starts in, each to be beaten by its flag on every rank
    env = clean_env(HORA_FUSION_THRESHOLD="12345", HOROVOD_CYCLE_TIME="7", HORA_CACHE_CAPACITY="8",
                    HOROVOD_TIMELINE="/tmp/horovod-timeline.json", HORA_TIMELINE_MARK_CYCLES="0",
                    HORA_STALL_CHECK_DISABLE="0", HOROVOD_STALL_CHECK_TIME_SECONDS="20",
                    HORA_STALL_SHUTDOWN_TIME_SECONDS="30")
    cfgs = show_config(
        "--fusion-threshold-mb", "0.5",
        "--cycle-time-ms", "2.5",
        "--cache-capacity", "0",
        "--timeline-filename", "timeline.json",
        "--timeline-mark-cycles",
        "--no-stall-check",
        "--stall-check-warning-time-seconds", "15",
        "--stall-check-shutdown-time-seconds", "45",
        env=env,
        np=2,
        cwd=tmp_path,
    )
    assert cfgs == [{
        "fusion_threshold": 512 * 1024,
        "cycle_time_ms": 2.5,
        "cache_capacity": 0,
        "stall_check_disable": True,
        "stall_check_time": 15.0,
        "stall_shutdown_time": 45.0,
        "timeline": str(tmp_path / "timeline.json"),  # absolute, against the launcher's directory
        "timeline_mark_cycles": True,
    }] * 2
