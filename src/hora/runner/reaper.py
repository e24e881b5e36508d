"""What ends each local rank's process group when ``hora run`` itself is killed (SIGKILL included).

A rank dies with the launcher (PDEATHSIG), but what the rank started lives on in the rank's process group under
PID 1. The launcher therefore starts a tiny shell in a session of its own that reads the ranks' process group ids
from a pipe. The launcher ends normally by writing ``done`` (it has stopped its ranks itself); when it dies any
other way, the pipe closes without ``done`` and the shell kills every group it was told about (and removes the
job's private stacks directory, :mod:`hora.runner.stacks`, and runs the commands it was given, such as ``hora
job``'s removal of its network namespaces: nobody would clean those up otherwise). A group id cannot
be reused while any process of the group lives, so the groups it kills are the ranks' own.
"""

from __future__ import annotations

import shlex
import subprocess

__all__ = ["GroupReaper"]

_SCRIPT = (
    'd=; c=; while read -r p; do case "$p" in done) exit 0;; dir:*) d="${p#dir:}";; cmd:*) c="$c${p#cmd:};";; '
    '*) set -- "$@" "$p";; esac; done; '
    'for p in "$@"; do kill -9 "-$p" 2>/dev/null; done; [ -z "$d" ] || rm -rf -- "$d"; eval "$c"'
)


class GroupReaper:
    """Kills the process groups handed to :meth:`add` if this process dies before :meth:`close`."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None
        try:
            self._proc = subprocess.Popen(
                ["/bin/sh", "-c", _SCRIPT],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:  # no /bin/sh: the ranks still die with the launcher, only their children may not
            self._proc = None

    def add(self, pgid: int) -> None:
        self._send(f"{pgid}\n")

    def remove_on_death(self, directory: str) -> None:
        """Also remove ``directory`` (the job's private stacks directory) if this process dies before :meth:`close`."""
        if "\n" not in directory:
            self._send(f"dir:{directory}\n")

    def run_on_death(self, argv: list[str]) -> None:
        """Also run ``argv`` (after the kills) if this process dies before :meth:`close`: ``hora job`` removes its
        network namespaces and bridge this way (they would stay until the next job otherwise)."""
        line = shlex.join(argv)
        if "\n" not in line:
            self._send(f"cmd:{line}\n")

    def close(self) -> None:
        """The launcher has stopped its ranks itself: let the reaper go without killing anything."""
        if self._proc is None:
            return
        self._send("done\n")
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass
