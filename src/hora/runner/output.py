"""Worker output: prefix each line with its rank, copy it to per-rank files, keep the last lines for the report.

Output is forwarded as it arrives, not line by line: a progress bar that redraws its line with carriage returns
(tqdm) shows live, as under torchrun. Each line start gets the rank's prefix, a carriage return is followed by the
prefix again (so the redrawn line keeps it), and when another rank writes to the same terminal stream while a
line is unfinished, that line is ended first so the two never run together.
"""

from __future__ import annotations

import os
import re
import selectors
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO

__all__ = ["OutputPump"]

TAIL_LINES = 20
MAX_LINE = 64 * 1024  # bytes of an unfinished line kept for the tails and captures before it is taken as a line
_BREAKS = re.compile(r"(\r\n|\n|\r)")


class OutputPump:
    """Reads every worker's stdout and stderr pipe on one thread and forwards whole lines.

    ``[3]<stdout>: text`` goes to this process's stdout (stderr lines to its stderr), as horovodrun prints them.
    With ``directory``, each rank's raw output is also written to ``DIR/rank.<r>/stdout`` and ``.../stderr``.
    With ``capture``, lines are kept in memory (``lines[rank][stream]``) instead of printed.
    """

    def __init__(self, directory: str | None = None, capture: bool = False, prefix: bool = True) -> None:
        self._sel = selectors.DefaultSelector()
        self._dir = Path(directory) if directory else None
        self._capture = capture
        self._prefix = prefix
        self._files: dict[tuple[int, str], IO[bytes]] = {}
        self._partial: dict[tuple[int, str], bytes] = {}
        self.tails: dict[int, deque[str]] = {}
        self.lines: dict[int, dict[str, list[str]]] = {}
        self._open = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()
        #: per terminal stream, the (rank, stream) whose line is unfinished on it
        self._open_line: dict[str, tuple[int, str] | None] = {"stdout": None, "stderr": None}

    def add(self, rank: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.tails[rank] = deque(maxlen=TAIL_LINES)
        self.lines[rank] = {"stdout": [], "stderr": []}
        for stream, pipe in (("stdout", stdout), ("stderr", stderr)):
            os.set_blocking(pipe.fileno(), False)
            self._sel.register(pipe, selectors.EVENT_READ, (rank, stream))
            self._partial[(rank, stream)] = b""
            if self._dir is not None:
                d = self._dir / f"rank.{rank}"
                d.mkdir(parents=True, exist_ok=True)
                self._files[(rank, stream)] = open(d / stream, "wb")  # noqa: SIM115 - closed in _finish
            self._open += 1

    def add_remote(self, rank: int) -> None:
        """A rank whose output arrives through :meth:`feed` (from a remote host's agent), not through pipes."""
        self.tails[rank] = deque(maxlen=TAIL_LINES)
        self.lines[rank] = {"stdout": [], "stderr": []}
        for stream in ("stdout", "stderr"):
            self._partial[(rank, stream)] = b""
            if self._dir is not None:
                d = self._dir / f"rank.{rank}"
                d.mkdir(parents=True, exist_ok=True)
                self._files[(rank, stream)] = open(d / stream, "wb")  # noqa: SIM115 - closed in close_remote

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        """Output of a remote rank (called by the thread that reads its host's agent)."""
        self._feed(rank, stream, data)

    def close_remote(self, rank: int, stream: str) -> None:
        """A remote rank's stream ended: forward its unfinished last line."""
        self._flush_partial(rank, stream)
        f = self._files.pop((rank, stream), None)
        if f is not None:
            f.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hora-output", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while self._open:
            for key, _ in self._sel.select(timeout=0.5):
                rank, stream = key.data
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    self._feed(rank, stream, data)
                else:
                    self._sel.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    self._flush_partial(rank, stream)
                    f = self._files.pop((rank, stream), None)
                    if f is not None:
                        f.close()
                    self._open -= 1
        self._sel.close()

    def _feed(self, rank: int, stream: str, data: bytes) -> None:
        f = self._files.get((rank, stream))
        if f is not None:
            f.write(data)
            f.flush()
        if not self._capture:
            self._live(rank, stream, data.decode(errors="replace"))
        buf = self._partial[(rank, stream)] + data
        *complete, rest = buf.split(b"\n")
        if len(rest) > MAX_LINE:  # no newline for a long while (progress bars): take it as a line for the tails
            complete.append(rest)
            rest = b""
        self._partial[(rank, stream)] = rest
        for line in complete:
            self._record(rank, stream, line.decode(errors="replace"))

    def _flush_partial(self, rank: int, stream: str) -> None:
        rest = self._partial.pop((rank, stream), b"")
        if rest:
            self._record(rank, stream, rest.decode(errors="replace"))
        if not self._capture:
            with self._write_lock:
                if self._open_line[stream] == (rank, stream):  # end its unfinished last line
                    self._open_line[stream] = None
                    self._write(stream, "\n", locked=True)

    def _record(self, rank: int, stream: str, line: str) -> None:
        """A whole line, for the report's tail and for captured output."""
        line = line.rstrip("\r")
        if "\r" in line:  # a redrawn line (a progress bar): what the terminal shows is the last drawing
            line = line.rsplit("\r", 1)[1] or line
        if stream == "stderr":
            self.tails[rank].append(line)
        if self._capture:
            self.lines[rank][stream].append(line)

    def _live(self, rank: int, stream: str, text: str) -> None:
        """Forward ``text`` now, prefixing every line start (see the module's docstring)."""
        key = (rank, stream)
        prefix = f"[{rank}]<{stream}>: " if self._prefix else ""
        out = []
        with self._write_lock:
            owner = self._open_line[stream]
            for piece in _BREAKS.split(text):
                if not piece:
                    continue
                if piece in ("\n", "\r\n"):
                    if owner != key:  # an empty line, or ours was cut by another rank's output
                        out.append(("\n" if owner is not None else "") + prefix)
                    out.append("\n")
                    owner = None
                elif piece == "\r":
                    if owner == key:
                        out.append("\r" + prefix)  # the line is redrawn: it keeps its prefix
                    else:
                        out.append(("\n" if owner is not None else "") + prefix)
                        owner = key
                else:
                    if owner != key:
                        out.append(("\n" if owner is not None else "") + prefix)
                        owner = key
                    out.append(piece)
            self._open_line[stream] = owner
            self._write(stream, "".join(out), locked=True)

    def _write(self, stream: str, text: str, locked: bool = False) -> None:
        if not text:
            return
        target = sys.stdout if stream == "stdout" else sys.stderr
        if not locked:
            self._write_lock.acquire()
        try:
            target.write(text)
            target.flush()
        except (BrokenPipeError, ValueError):
            pass
        finally:
            if not locked:
                self._write_lock.release()
