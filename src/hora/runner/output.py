"""Worker output: prefix each line with its rank, copy it to per-rank files, keep the last lines for the report.

On a terminal, output is forwarded as it arrives, not line by line: a progress bar's carriage-return redraws and a
partial line that stays unfinished show live (torchrun shows them too), with the rank prefix written at every line
start and after every ``\r``. A partial line without ``\r`` is held for :data:`HOLD` seconds first, because
unbuffered ``print()`` writes a line in several pieces and two ranks' pieces must not be cut into each other's
lines; when another rank writes while a line is open, that line is ended first and continues later with its prefix
again. Files (``--output-filename``) get the raw bytes; captures and the report's tail get whole lines.
"""

from __future__ import annotations

import codecs
import os
import selectors
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hora.runner.observer import RunObserver

__all__ = ["OutputPump"]

TAIL_LINES = 20
MAX_LINE = 64 * 1024  # bytes of an unfinished line kept before it is captured or shown anyway
HOLD = 0.2  # seconds a partial line without a carriage return waits for the rest of its line


class OutputPump:
    """Reads every worker's stdout and stderr pipe on one thread and forwards their output.

    ``[3]<stdout>: text`` goes to this process's stdout (stderr to its stderr), as horovodrun prints it.
    With ``directory``, each rank's raw output is also written to ``DIR/rank.<r>/stdout`` and ``.../stderr``.
    With ``capture``, lines are kept in memory (``lines[rank][stream]``) instead of printed; with ``quiet`` they are
    neither (only the observer and ``directory`` get them).
    """

    def __init__(
        self, directory: str | None = None, capture: bool = False, prefix: bool = True, hold: float = HOLD,
        quiet: bool = False,
    ) -> None:
        self._sel = selectors.DefaultSelector()
        self._dir = Path(directory) if directory else None
        self._capture = capture
        self._quiet = quiet  # nothing printed: the lines go to the observer (and DIR) only
        self._prefix = prefix
        self._hold = hold
        self._files: dict[tuple[int, str], IO[bytes]] = {}
        self._partial: dict[tuple[int, str], bytes] = {}
        self._shown: dict[tuple[int, str], int] = {}  # bytes of the partial line already on the terminal
        self._held: dict[tuple[int, str], float] = {}  # when a partial line started waiting
        self._decoders: dict[tuple[int, str], codecs.IncrementalDecoder] = {}
        self._open_line: dict[str, tuple[int, str] | None] = {"stdout": None, "stderr": None}
        self.tails: dict[int, deque[str]] = {}
        self.labels: dict[int, str] = {}  # keys that are not ranks (parameter servers: -1 -> "ps0")
        self.lines: dict[int, dict[str, list[str]]] = {}
        self._open = 0
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self.observer: RunObserver | None = None  # gets every whole line too (hora run --record)

    def _add_rank(self, rank: int) -> None:
        self.tails[rank] = deque(maxlen=TAIL_LINES)
        self.lines[rank] = {"stdout": [], "stderr": []}
        for stream in ("stdout", "stderr"):
            self._partial[(rank, stream)] = b""
            self._shown[(rank, stream)] = 0
            self._decoders[(rank, stream)] = codecs.getincrementaldecoder("utf-8")(errors="replace")
            if self._dir is not None:
                d = self._dir / self.labels.get(rank, f"rank.{rank}")  # a server's output goes to DIR/ps<i>
                d.mkdir(parents=True, exist_ok=True)
                self._files[(rank, stream)] = open(d / stream, "wb")  # noqa: SIM115 - closed in _close

    def add(self, rank: int, stdout: IO[bytes], stderr: IO[bytes] | None) -> None:
        """A local rank's pipes; ``stderr`` None when the rank writes both streams into ``stdout``."""
        with self._lock:
            self._add_rank(rank)
            for stream, pipe in (("stdout", stdout), ("stderr", stderr)):
                if pipe is None:
                    continue
                os.set_blocking(pipe.fileno(), False)
                self._sel.register(pipe, selectors.EVENT_READ, (rank, stream))
                self._open += 1

    def add_remote(self, rank: int) -> None:
        """A rank whose output arrives through :meth:`feed` (from a remote host's agent), not through pipes; may be
        called while the pump runs (a remote server's restart)."""
        with self._lock:
            self._add_rank(rank)

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        """Output of a remote rank (called by the thread that reads its host's agent)."""
        self._feed(rank, stream, data)
        self._show_due(time.monotonic())

    def close_remote(self, rank: int, stream: str) -> None:
        """A remote rank's stream ended: forward its unfinished last line."""
        self._close(rank, stream)

    def hold_open(self) -> Callable[[], None]:
        """Keep the pump running while no worker is connected (an elastic job between its workers); returns the
        function that lets it end once the last worker's pipes close."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        with self._lock:
            self._sel.register(read_end, selectors.EVENT_READ, None)
            self._open += 1
        return lambda: os.close(write_end)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hora-output", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while self._open:
            with self._lock:
                due = min(self._held.values(), default=None)
            wait = 0.5 if due is None else max(0.0, min(0.5, due + self._hold - time.monotonic()))
            for key, _ in self._sel.select(timeout=wait):
                if key.data is None:  # hold_open's pipe: closed, so the pump may end
                    self._sel.unregister(key.fileobj)
                    os.close(key.fd)
                    with self._lock:
                        self._open -= 1
                    continue
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
                    self._close(rank, stream)
                    with self._lock:
                        self._open -= 1
            self._show_due(time.monotonic())
        self._sel.close()

    def _close(self, rank: int, stream: str) -> None:
        with self._lock:
            rest = self._partial.pop((rank, stream), b"")
            self._held.pop((rank, stream), None)
            if rest:
                self._line(rank, stream, rest)
            f = self._files.pop((rank, stream), None)
            if f is not None:
                f.close()

    def _feed(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        with self._lock:
            f = self._files.get(key)
            if f is not None:
                f.write(data)
                f.flush()
            *complete, rest = (self._partial[key] + data).split(b"\n")
            if len(rest) > MAX_LINE and self._capture:  # no newline for a long while: keep it rather than hoard it
                complete.append(rest)
                rest = b""
            self._partial[key] = rest
            for line in complete:
                self._line(rank, stream, line)
            if not rest:
                self._held.pop(key, None)
            elif self._capture:
                pass
            elif b"\r" in rest or len(rest) > MAX_LINE or self._hold <= 0:
                self._show(key)
            else:
                self._held.setdefault(key, time.monotonic())

    def _show_due(self, now: float) -> None:
        """Show partial lines that waited :data:`HOLD` seconds for their newline."""
        with self._lock:
            for key in [k for k, since in self._held.items() if now - since >= self._hold]:
                self._show(key)

    def _show(self, key: tuple[int, str]) -> None:
        """Put what the terminal has not shown yet of ``key``'s partial line on it, leaving the line open."""
        self._held.pop(key, None)
        partial = self._partial[key]
        if len(partial) > self._shown[key]:
            self._write(key, self._decoders[key].decode(partial[self._shown[key] :]), end=False)
            self._shown[key] = len(partial)

    def _line(self, rank: int, stream: str, raw: bytes) -> None:
        """A whole line (its newline removed): record it, and print what the terminal has not shown yet."""
        key = (rank, stream)
        line = raw.decode(errors="replace").rstrip("\r")
        if self.observer is not None:
            self.observer.line(self.labels.get(rank, str(rank)), stream, line)
        if stream == "stderr":
            drawings = [piece for piece in line.split("\r") if piece]
            self.tails[rank].append(drawings[-1] if drawings else "")
        if self._capture:
            self.lines[rank][stream].append(line)
            return
        shown, self._shown[key] = self._shown.get(key, 0), 0
        self._write(key, self._decoders[key].decode(raw[shown:], final=True).rstrip("\r"), end=True)

    def _write(self, key: tuple[int, str], text: str, end: bool) -> None:
        if self._quiet:
            return
        rank, stream = key
        prefix = f"[{self.labels.get(rank, rank)}]<{stream}>: " if self._prefix else ""
        sink = _sink(stream)
        other = self._open_line[sink]
        if other != key:
            if other is not None:  # end another unfinished line first: ranks never share a line
                _put(other[1], "\n")
            text = prefix + text.lstrip("\r")
        self._open_line[sink] = None if end else key
        _put(stream, text.replace("\r", "\r" + prefix) + ("\n" if end else ""))


def _sink(stream: str) -> str:
    """Where ``stream`` ends up: "stdout" also for stderr when both go to the same terminal or file."""
    if stream == "stderr":
        try:
            out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
        except (OSError, ValueError, AttributeError):
            return "stderr"
        if (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino):
            return "stdout"
    return stream


def _put(stream: str, text: str) -> None:
    target = sys.stdout if stream == "stdout" else sys.stderr
    try:
        target.write(text)
        target.flush()
    except (BrokenPipeError, ValueError):
        pass
