"""A job's own Python environment: ``requirements.txt`` and a ``setup.py`` package in the source dir go into a
virtual environment in the job directory that also sees this Python's packages, so what is already installed
(torch, numpy) is not installed again. Its python then runs the ranks' scripts. pip honours PIP_CONSTRAINT,
PIP_INDEX_URL, PIP_NO_INDEX ... from the job's environment."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hora._proc import die_with_parent, kill_group
from hora.config.variables import environment
from hora.errors import HoraError

__all__ = ["JobEnvironment", "run_in_own_group"]


def run_in_own_group(cmd: list[str], cwd: Path, env: Mapping[str, str], log: Any, timeout: float) -> int:
    """Run ``cmd`` in its own process group and return its exit code; on a stop (an exception here, e.g. the
    max_run or ``hora job stop`` signal) or after ``timeout`` the whole group is killed: pip's build
    subprocesses go with it."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        return proc.wait(timeout)
    except BaseException as exc:
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise HoraError(f"{' '.join(cmd[:4])} ... took longer than {timeout:g}s") from None
        raise


class JobEnvironment:
    """The virtual environment of the job in ``job_dir`` (``env/``), made only when there is something to install."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.dir = job_dir / "env"
        self.python = self.dir / "bin" / "python"
        self._log = job_dir / "logs" / "install.log"

    @property
    def exists(self) -> bool:
        return self.python.exists()

    def _create(self) -> None:
        """A virtual environment that sees every package this Python has (system site-packages, and the outer
        virtual environment's through a .pth file), so pip installs only what is missing."""
        venv = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(self.dir)]
        with open(self._log, "ab") as log:
            if run_in_own_group(venv, self.job_dir, environment(), log, 300) != 0:
                raise HoraError(f"cannot create the job's environment {self.dir} (see logs/install.log)")
        if sys.prefix != sys.base_prefix:  # running inside a venv: its packages are not the "system" ones
            import site
            import sysconfig

            purelib = sysconfig.get_path("purelib", vars={"base": str(self.dir), "platbase": str(self.dir)})
            Path(purelib, "_hora_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    def install(
        self, src: Path, job_environment: Mapping[str, str], timeout: float, say: Callable[[str], None]
    ) -> None:
        """requirements.txt, then a setup.py package of ``src``, into the environment (made first); nothing when
        ``src`` has neither."""
        steps = []
        if (src / "requirements.txt").is_file():
            steps.append(("requirements.txt", ["-r", "requirements.txt"]))
        if (src / "setup.py").is_file():
            steps.append(("the setup.py package", ["--no-build-isolation", "."]))
        if not steps:
            return
        say(f"creating the job's environment {self.dir}")
        self._create()
        env = {**environment(), **job_environment}
        for what, args in steps:
            say(f"installing {what} into {self.dir}")
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(self.python),
                "install",
                "--disable-pip-version-check",
                "--no-input",
                *args,
            ]
            with open(self._log, "ab") as log:
                returncode = run_in_own_group(cmd, src, env, log, timeout)
            if returncode != 0:
                tail = self._log.read_text(errors="replace").strip().splitlines()[-8:]
                raise HoraError(f"installing {what} failed (pip exit code {returncode}):\n  " + "\n  ".join(tail))
