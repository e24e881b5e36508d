"""The launcher's side of rank stacks (:mod:`hora._runtime.stacks`): a private directory per job, asking live
ranks for their stacks (SIGCONT, then SIGUSR1) before they are stopped or killed, and a short account of where each
one was for the report.

Only the frames outside hora and Python's threading machinery are summarised (where the *script* was); the full
dumps stay in the directory, or under ``--output-filename``'s ``rank.<r>/stacks``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from hora._runtime.stacks import stack_file

__all__ = ["RemoteStacks", "StackDumps", "agent_stacks", "where"]

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_INTERNAL = (os.sep + "hora" + os.sep, os.sep + "threading.py", os.sep + "selectors.py", os.sep + "socket.py")


def where(dump: str, limit: int = 3) -> list[str]:
    """The innermost frames of ``dump`` (a faulthandler dump) that are the script's, not hora's or Python's
    threading machinery: ``file:line in function``, innermost first."""
    out = []
    for line in dump.splitlines():
        m = _FRAME.match(line)
        if m and not any(part in m["file"] for part in _INTERNAL):
            out.append(f"{m['file']}:{m['line']} in {m['func']}")
            if len(out) == limit:
                break
    return out


#: tgkill's system call number, where it is known (Linux x86-64, arm64).
_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def _signal_main_thread(pid: int, sig: int) -> None:
    """``sig`` to the main thread of ``pid`` (its thread id is its pid), else to the process."""
    if _TGKILL is not None and sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_TGKILL, pid, pid, int(sig)) == 0:
            return
        if ctypes.get_errno() == errno.ESRCH:
            raise ProcessLookupError(pid)
    os.kill(pid, sig)


def agent_stacks() -> StackDumps:
    """A host agent's stacks directory (``hora-stacks-agent-<pid>-*``), after removing those of agents that are
    gone: an agent killed outright (SIGKILL, a lost host) cannot remove its own."""
    for stale in Path(tempfile.gettempdir()).glob("hora-stacks-agent-*-*"):
        try:
            pid = int(stale.name.split("-")[3])
            if stale.stat().st_uid != os.getuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (ValueError, IndexError, OSError):
            continue
    return StackDumps(f"agent-{os.getpid()}")


class RemoteStacks(Protocol):
    """A remote host's session (:class:`hora.runner.remote_host.RemoteHost`): its agent takes its ranks' stacks."""

    def ask_stacks(self, ranks: list[int], wait: float) -> None: ...

    def take_stacks(self, ranks: list[int], deadline: float) -> dict[int, str]: ...


class StackDumps:
    """A job's stacks directory (0700, under the runtime directory), and the dumps captured in it."""

    def __init__(self, job_id: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"hora-stacks-{job_id}-"))
        self.captured: dict[int, str] = {}  # rank (or worker number) -> its dump

    def capture(
        self, pids: Mapping[int, int], wait: float = 1.0, remote: Mapping[int, RemoteStacks] | None = None
    ) -> dict[int, str]:
        """Ask the ranks ``pids`` (rank -> pid) that registered for their stacks, and at the same time the remote
        ranks ``remote`` (rank -> its host's session, whose agent does the same there); rank -> dump, for those
        that answered within ``wait`` seconds (the remote ones get one more second to cross the connection)."""
        hosts: dict[int, tuple[RemoteStacks, list[int]]] = {}
        for r, session in (remote or {}).items():
            hosts.setdefault(id(session), (session, []))[1].append(r)
        deadline = time.monotonic() + wait + 1.0
        for session, ranks in hosts.values():
            session.ask_stacks(ranks, wait)
        got = self._capture_local(pids, wait)
        for session, ranks in hosts.values():
            got.update(session.take_stacks(ranks, deadline))
        self.captured.update(got)
        return got

    def _capture_local(self, pids: Mapping[int, int], wait: float) -> dict[int, str]:
        files = {r: stack_file(self.directory, pid) for r, pid in pids.items()}
        asked = {}
        for r, path in files.items():
            if not path.exists():
                continue  # never initialised hora (or not a Python rank): SIGUSR1 would end it
            before = path.stat().st_size
            try:  # SIGUSR1 first, to the main thread: a frozen rank's main thread handles it the moment SIGCONT lets
                # it run, before it executes anything (sent to the process, another thread could take it while the
                # main thread moves on)
                _signal_main_thread(pids[r], signal.SIGUSR1)
                os.kill(pids[r], signal.SIGCONT)
            except ProcessLookupError:
                continue
            asked[r] = (path, before)
        deadline = time.monotonic() + wait
        got: dict[int, str] = {}
        while asked and time.monotonic() < deadline:
            time.sleep(0.05)
            for r, (path, before) in list(asked.items()):
                size = path.stat().st_size
                if size > before:
                    time.sleep(0.05)  # let the dump finish: faulthandler writes it in one go, frame by frame
                    with path.open() as f:
                        f.seek(before)
                        got[r] = f.read()
                    del asked[r]
        return got

    def save(self, output_dir: str | None, keep: bool = True) -> str:
        """Keep the captured dumps (as ``rank.<r>/stacks`` under ``output_dir``, else — with ``keep``, for a user at
        a terminal — ``rank.<r>.stacks`` in the stacks directory); remove what is not needed. Returns where they
        are ("" when none is kept: a caller of the Python API has them in ``RunResult.stacks``)."""
        raw = list(self.directory.glob("*.stacks"))
        if not self.captured or (not keep and not output_dir):
            shutil.rmtree(self.directory, ignore_errors=True)
            return ""
        for path in raw:
            path.unlink(missing_ok=True)
        if output_dir:
            for r, dump in self.captured.items():
                target = Path(output_dir) / f"rank.{r}"
                target.mkdir(parents=True, exist_ok=True)
                (target / "stacks").write_text(dump)
            shutil.rmtree(self.directory, ignore_errors=True)
            return str(Path(output_dir) / "rank.<r>" / "stacks")
        for r, dump in self.captured.items():
            (self.directory / f"rank.{r}.stacks").write_text(dump)
        return str(self.directory)
