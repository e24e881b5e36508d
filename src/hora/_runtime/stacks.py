"""Where every rank was when hora run had to stop it: Python stacks of all threads, dumped by ``faulthandler`` on
SIGUSR1 into a per-process file of the job's stacks directory (``HORA_STACKS_DIR``, made by hora run), and read
back by the launcher (:mod:`hora.runner.stacks`).

faulthandler dumps from inside the signal handler, in C, so a rank stuck in a C call (a wait, a BLAS kernel) dumps
too; a rank frozen by SIGSTOP dumps once it is continued (the launcher sends SIGCONT first). Only a process that
registered (its file exists) is sent SIGUSR1: for any other, SIGUSR1 would end it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import IO

from hora.config.variables import read

__all__ = ["register_stack_dump", "stack_file"]

_file: IO[str] | None = None


def stack_file(directory: str | os.PathLike[str], pid: int) -> Path:
    return Path(directory) / f"{pid}.stacks"


def register_stack_dump() -> None:
    """Under hora run: dump every thread's stack to this process's file on SIGUSR1 (once per process)."""
    global _file
    directory = read("HORA_STACKS_DIR")
    if _file is not None or not directory or not hasattr(signal, "SIGUSR1"):
        return
    try:
        _file = open(stack_file(directory, os.getpid()), "a")  # noqa: SIM115 - open for the process's life
    except OSError:
        return  # the directory is gone (the launcher ended): nothing will ask for stacks
    faulthandler.register(signal.SIGUSR1, file=_file, all_threads=True, chain=False)
