"""Worker output: prefix each line with its rank, copy it to per-rank files, keep the last lines for the report."""

from __future__ import annotations

import os
import selectors
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO

__all__ = ["OutputPump"]

TAIL_LINES = 20
MAX_LINE = 64 * 1024  # bytes of an unfinished line kept before it is forwarded anyway


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
        buf = self._partial[(rank, stream)] + data
        *complete, rest = buf.split(b"\n")
        if (
            len(rest) > MAX_LINE
        ):  # no newline for a long while (progress bars): pass it on rather than hoard it
            complete.append(rest)
            rest = b""
        self._partial[(rank, stream)] = rest
        for line in complete:
            self._emit(rank, stream, line.decode(errors="replace"))

    def _flush_partial(self, rank: int, stream: str) -> None:
        rest = self._partial.pop((rank, stream), b"")
        if rest:
            self._emit(rank, stream, rest.decode(errors="replace"))

    def _emit(self, rank: int, stream: str, line: str) -> None:
        line = line.rstrip("\r")
        if stream == "stderr":
            self.tails[rank].append(line)
        if self._capture:
            self.lines[rank][stream].append(line)
            return
        target = sys.stdout if stream == "stdout" else sys.stderr
        text = f"[{rank}]<{stream}>: {line}\n" if self._prefix else line + "\n"
        with self._write_lock:
            try:
                target.write(text)
                target.flush()
            except (BrokenPipeError, ValueError):
                pass
