"""What an uncaught exception that passed through hora looks like in a rank: the script's own frames and hora's
one-line reason, not hora's internals. A rank whose peer died, or that was interrupted inside a collective, would
otherwise print a dozen frames of the engine that say nothing to the user. The full traceback (chained exceptions
included) goes to a file in hora's private runtime directory, which the message names (the newest 50 are kept); for
a ``KeyboardInterrupt`` (Ctrl-C, whose cause the user knows) nothing is kept.

Installed by ``init()`` when the script has not set ``sys.excepthook`` itself; an exception that never passed
through hora is printed as Python prints it.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType

__all__ = ["install", "short_traceback"]

_HORA = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_where: Path | None = None  # the directory of the full tracebacks (hora's runtime directory)
_label = ""  # "rank 3 of job 1f2e..."
#: Full tracebacks kept in the runtime directory, newest first.
KEEP = 50


def install(directory: Path | None, label: str) -> None:
    """Use :func:`short_traceback` for uncaught exceptions, saving full ones in ``directory``."""
    global _where, _label
    _where, _label = directory, label
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _hook


def short_traceback(
    etype: type[BaseException], value: BaseException, tb: TracebackType | None, saved: str | None
) -> str | None:
    """The traceback without hora's innermost frames (everything down to the script's last frame, its call into
    hora, then the error), or None when the error was raised in the script's own code, or never left hora (Python's
    own traceback is then as short). Hora frames further out (a runner that called the script's function) stay."""
    frames = traceback.extract_tb(tb)
    last = max((i for i, f in enumerate(frames) if not f.filename.startswith(_HORA)), default=None)
    if last is None or last == len(frames) - 1:
        return None
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames[: last + 1])]
    where = f"; the full traceback is in {saved}" if saved else ""
    lines.append(f"  [{len(frames) - last - 1} frame(s) inside hora left out{where}]\n")
    return "".join(lines + traceback.format_exception_only(etype, value))


def _hook(etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    saved = None if issubclass(etype, KeyboardInterrupt) else _save(etype, value, tb)
    short = short_traceback(etype, value, tb, saved)
    if short is None:
        sys.__excepthook__(etype, value, tb)
    else:
        sys.stderr.write(short)
        sys.stderr.flush()


def _save(etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> str | None:
    if _where is None:
        return None
    path = _where / f"traceback-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{_label}\n" + "".join(traceback.format_exception(etype, value, tb)))
    except OSError:
        return None
    _prune(_where)
    return str(path)


def _prune(directory: Path) -> None:
    """Keep the newest :data:`KEEP` tracebacks: a directory of every failure ever would only grow."""
    try:
        saved = sorted(directory.glob("traceback-*.txt"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in saved[:-KEEP]:
        old.unlink(missing_ok=True)
