"""The timeline: a Chrome-trace JSON file of what the engine did to each tensor, in Horovod's phase names.

Rank 0's engine owns one :class:`Timeline` while a timeline is on (``HORA_TIMELINE`` / ``HOROVOD_TIMELINE``,
``hora run --timeline-filename`` or ``hora.start_timeline``). The file loads in https://ui.perfetto.dev and
chrome://tracing; see docs/timeline.md.

Format: a JSON array of trace events. Every tensor name gets its own track, a "process" whose pid is a small
integer handed out in order of first use (1, 2, ...) and named by ``process_name`` / ``process_sort_index``
metadata events, with Horovod's name for the tensor (:func:`track_label`); pid 0 is left for the global
``CYCLE_START`` markers. Timestamps are microseconds since the timeline started (``time.perf_counter_ns``). Per
tensor, events nest like Horovod's: a ``NEGOTIATE_<KIND>`` phase with one zero-length tick per rank as it becomes
ready, then the operation itself (``ALLREDUCE``, ...) with the activities inside it (``QUEUE``,
``MEMCPY_IN_FUSION_BUFFER``, ``SHM_ALLREDUCE``, ...), at most one at a time.
The emitters keep the nesting valid whatever order they are called in: ``start``/``negotiate_start`` close what
is still open for that tensor, ``end`` closes an open activity first, and an ``*_end`` with nothing to close is
ignored. A timeline never raises into the engine once it is open: a failing write is logged once and the
timeline stops recording.

Cost and threads: an emitter takes a lock, reads the clock and appends a tuple to a list. A daemon writer thread
serialises and writes the list every ~100 ms; ``flush()`` and ``close()`` write synchronously. Emitters,
``flush`` and ``close`` may be called from any thread. An ``atexit`` hook closes the timeline on a normal
interpreter exit (including ``SystemExit`` raised by a SIGTERM handler).

Crash safety: the file at ``path`` is a complete, valid JSON array at every moment after the constructor
returns, so a rank killed with SIGKILL (or a reader opening the file mid-run) always finds a loadable trace.
Appending in place cannot give that: Linux copies a ``write``/``pwrite`` page by page and stops at a page boundary
when SIGKILL is pending, so a batch spanning pages can be cut in the middle (measured: most random kills of a
process writing 8 KiB batches in a loop left a file cut at a multiple of 4096 bytes). Instead the timeline keeps
two files, ``path`` and a helper ``path + ".hora-swap"``, which alternate: every batch is appended (the file
always ends with ``"\\n]"``, and a batch overwrites that tail with ``",\\n" + events + "\\n]"``) to the file that
is NOT at ``path``, together with the batch before it that this file missed, and that file is then renamed over
``path``. ``rename`` is atomic, so ``path`` names either the old or the new complete file. The file that was at
``path`` stays reachable through a hard link (``path + ".hora-swap2"`` for a moment, then ``path +
".hora-swap"``) and becomes the next target. Each event is written twice; the cost per write is O(batch), not
O(file). ``close()`` removes the helper; a SIGKILL may leave it behind, cut short when the kill landed in a write to
it (it is scratch: never read, safe to delete). Events emitted after the last write are lost on SIGKILL: at most
~100 ms of them. The page cache survives the process; a power loss or kernel crash is not covered (nothing is fsync'ed).

Where the helper cannot be made (the directory is not writable, or the file system has no hard links) the
timeline logs a warning and appends to ``path`` in place: then a SIGKILL landing inside a write that crosses a
page boundary can leave ``path`` cut short.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from hora._engine.messages import Kind
from hora.errors import ConfigError

__all__ = ["FLUSH_INTERVAL", "Timeline", "request_args", "tensor_args", "tensor_names", "track_label"]

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 0.1
"""Seconds between the writer thread's writes: the most a SIGKILL can lose."""

SWAP_SUFFIX = ".hora-swap"
"""The helper file next to the timeline: ``path + SWAP_SUFFIX`` (and ``+ "2"`` during a swap)."""

_NEGOTIATE = "NEGOTIATE_"
_EMPTY = b"[\n]"
_TAIL = b"\n]"


class _Track:
    """One tensor's track: its pid and the labels of its open "B" events, outermost first (at most two)."""

    __slots__ = ("negotiating", "open", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.open: list[str] = []
        self.negotiating = False


# A pending event: (ph, label, pid, ts_ns, args). "M" carries the tensor name as its label.
_Event = tuple[str, str, int, int, dict[str, Any] | None]


class _File:
    """An open trace file that always ends with ``_TAIL``; ``append`` overwrites the tail with events + tail."""

    __slots__ = ("fd", "first", "size")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = len(_EMPTY)
        self.first = True  # no event in it yet

    def append(self, events: list[str]) -> None:
        data = (("\n" if self.first else ",\n") + ",\n".join(events)).encode() + _TAIL
        offset = self.size - len(_TAIL)
        view = memoryview(data)
        while view:  # usually one call; a regular file only writes less when interrupted or full
            n = os.pwrite(self.fd, view, offset)
            if n <= 0:
                raise OSError("pwrite wrote nothing")
            view = view[n:]
            offset += n
        self.size = offset
        self.first = False

    def restore(self) -> None:
        """Cut the file back to its content before a failed ``append`` (best effort)."""
        try:
            os.ftruncate(self.fd, self.size)
            os.pwrite(self.fd, _TAIL, self.size - len(_TAIL))
        except OSError:
            pass


def _create(path: str, shown: str, follow: bool = True) -> int:
    """Create or truncate ``path`` as an empty trace; ``ConfigError`` (naming ``shown``) when that fails."""
    # O_NONBLOCK: a FIFO without a reader fails at once instead of blocking (regular files ignore it)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise ConfigError(
            f"cannot write the timeline file {shown!r}: {e.strerror or e}; "
            "give a path to a writable file (HORA_TIMELINE, --timeline-filename or start_timeline)"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(
                f"the timeline file {shown!r} is not a regular file; give a regular file's path"
            )
        os.pwrite(fd, _EMPTY, 0)
    except OSError as e:
        os.close(fd)
        raise ConfigError(f"cannot write the timeline file {shown!r}: {e.strerror or e}") from None
    except ConfigError:
        os.close(fd)
        raise
    return fd


def _args_json(args: dict[str, Any]) -> str:
    """``args`` as a JSON object; values JSON cannot hold (objects, NaN, cycles) become strings."""
    try:
        return json.dumps(args, default=str, allow_nan=False)  # NaN is not JSON: browsers reject it
    except (TypeError, ValueError):
        return json.dumps({str(k): v if isinstance(v, (str, int)) else repr(v) for k, v in args.items()})


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Timeline:
    """Records trace events for rank 0's engine and writes them to ``path`` as Chrome-trace JSON.

    The file is created (or truncated) and holds a valid, empty trace ``[]`` when the constructor returns.
    Raises ``ConfigError`` naming ``path`` when it cannot be written or is not a regular file.
    """

    def __init__(self, path: str, mark_cycles: bool = False) -> None:
        self.path = os.fspath(path)
        self.mark_cycles = bool(mark_cycles)
        self._real = os.path.realpath(self.path)  # rename over a symlink's target, not over the symlink
        self._swap_path = self._real + SWAP_SUFFIX
        self._swap_path2 = self._swap_path + "2"
        self._files = [_File(_create(self._real, self.path))]
        self._active = 0  # index of the file that is at self._real
        self._lag: list[str] = []  # the last batch: written to the active file, not yet to the other one
        try:
            _unlink(self._swap_path2)
            self._files.append(_File(_create(self._swap_path, self._swap_path, follow=False)))
            os.link(self._real, self._swap_path2)  # hard links work here: the swap will
            os.unlink(self._swap_path2)
        except (OSError, ConfigError) as e:
            if len(self._files) > 1:
                os.close(self._files.pop().fd)
                _unlink(self._swap_path)
            log.warning(
                "hora timeline %s: cannot keep the helper file %s (%s); appending in place, so a SIGKILL "
                "during a write may leave the file cut short",
                self.path,
                self._swap_path,
                e,
            )
        self._failed = False
        self._owner = os.getpid()  # a forked child must not write into the parent's files
        self._t0 = time.perf_counter_ns()

        # _lock guards the pending list, the tracks and _closed (emitters hold it briefly); _io_lock orders the
        # writes (held around taking a batch and writing it); _close_lock makes a second close wait for the first.
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._pending: list[_Event] = []
        self._tracks: dict[str, _Track] = {}
        self._closed = False
        self._quoted: dict[
            str, str
        ] = {}  # JSON-quoted event names (phase names and ranks repeat): writer only

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._writer, name="hora-timeline", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Timeline({self.path!r}, mark_cycles={self.mark_cycles}, {state})"

    # ------------------------------------------------------------------ emitters (any thread, cheap)

    def negotiate_start(self, name: str, kind: str) -> None:
        """Begin the negotiation phase ``NEGOTIATE_<KIND>`` of tensor ``name`` (a no-op while it is open)."""
        with self._lock:
            if self._closed:
                return
            ts = time.perf_counter_ns()
            track = self._track(name, kind)
            if track.negotiating:  # already open (another rank's request started it): keep the first start
                return
            self._close_all(track, ts, None)
            label = _NEGOTIATE + kind.upper()
            track.open.append(label)
            track.negotiating = True
            self._pending.append(("B", label, track.pid, ts, None))

    def negotiate_rank_ready(self, name: str, rank: int) -> None:
        """A zero-length tick named after ``rank``: that rank has submitted ``name``."""
        with self._lock:
            if self._closed:
                return
            ts = time.perf_counter_ns()
            self._pending.append(("X", str(rank), self._track(name).pid, ts, None))

    def negotiate_end(self, name: str) -> None:
        """End the negotiation phase of ``name`` (ignored when none is open)."""
        with self._lock:
            if self._closed:
                return
            track = self._tracks.get(name)
            if track is not None and track.negotiating:
                self._close_all(track, time.perf_counter_ns(), None)

    def start(self, name: str, kind: str, args: dict[str, Any] | None = None) -> None:
        """Begin the operation on ``name``: a top-level event named ``kind.upper()``, e.g. ``ALLREDUCE``."""
        with self._lock:
            if self._closed:
                return
            ts = time.perf_counter_ns()
            track = self._track(name, kind)
            self._close_all(track, ts, None)  # a negotiation left open ends where the operation starts
            label = kind.upper()
            track.open.append(label)
            self._pending.append(("B", label, track.pid, ts, dict(args) if args else None))

    def activity_start(self, name: str, activity: str) -> None:
        """Begin ``activity`` (e.g. ``QUEUE``) inside the open phase of ``name``, ending an open activity first.

        Ignored when nothing is open for ``name``: activities live inside an operation (or a negotiation).
        """
        with self._lock:
            if self._closed:
                return
            track = self._tracks.get(name)
            if track is None or not track.open:
                return
            ts = time.perf_counter_ns()
            if len(track.open) > 1:
                self._pending.append(("E", track.open.pop(), track.pid, ts, None))
            track.open.append(activity)
            self._pending.append(("B", activity, track.pid, ts, None))

    def activity_end(self, name: str) -> None:
        """End the open activity of ``name`` (ignored when none is open)."""
        with self._lock:
            if self._closed:
                return
            track = self._tracks.get(name)
            if track is not None and len(track.open) > 1:
                self._pending.append(("E", track.open.pop(), track.pid, time.perf_counter_ns(), None))

    def end(self, name: str, args: dict[str, Any] | None = None) -> None:
        """End the operation (or negotiation) of ``name``, closing an open activity first; ``args`` go on it."""
        with self._lock:
            if self._closed:
                return
            track = self._tracks.get(name)
            if track is not None and track.open:
                self._close_all(track, time.perf_counter_ns(), dict(args) if args else None)

    @contextlib.contextmanager
    def activities(self, names: Iterable[str], activity: str) -> Iterator[None]:
        """``activity_start`` for every name on entry and ``activity_end`` for each on exit (also on error)."""
        names = list(names)
        for n in names:
            self.activity_start(n, activity)
        try:
            yield
        finally:
            for n in names:
                self.activity_end(n)

    def mark_cycle(self) -> None:
        """A global ``CYCLE_START`` instant at the start of an engine cycle; a no-op unless ``mark_cycles``."""
        if not self.mark_cycles:
            return
        with self._lock:
            if self._closed:
                return
            self._pending.append(("i", "CYCLE_START", 0, time.perf_counter_ns(), None))

    # ------------------------------------------------------------------ writing

    def flush(self) -> None:
        """Write everything emitted so far to the file now."""
        self._drain()

    def close(self) -> None:
        """Write what is pending and close the file. Idempotent; the emitters do nothing afterwards."""
        with self._close_lock:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
            self._stop.set()
            if self._thread is not threading.current_thread():
                self._thread.join()
            self._drain()
            with self._io_lock:
                for f in self._files:
                    os.close(f.fd)
                if len(self._files) > 1 and os.getpid() == self._owner:
                    _unlink(self._swap_path)
                    _unlink(self._swap_path2)
                self._files = []
            atexit.unregister(self.close)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _track(self, name: str, kind: str | None = None) -> _Track:
        """The track of ``name``, created with its metadata on first use. Called with ``_lock`` held."""
        track = self._tracks.get(name)
        if track is None:
            track = self._tracks[name] = _Track(len(self._tracks) + 1)
            self._pending.append(("M", track_label(name, kind), track.pid, 0, None))
        return track

    def _close_all(self, track: _Track, ts: int, args: dict[str, Any] | None) -> None:
        """Emit an "E" for every open event of ``track``, innermost first; ``args`` go on the outermost."""
        while track.open:
            label = track.open.pop()
            self._pending.append(("E", label, track.pid, ts, None if track.open else args))
        track.negotiating = False

    def _writer(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL):
            self._drain()

    def _drain(self) -> None:
        with self._io_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch or not self._files or self._failed or os.getpid() != self._owner:
                return
            try:
                events = self._serialise(batch)
            except Exception as e:  # json cannot take these args even with default=str (a cycle): drop them
                log.warning(
                    "hora timeline %s: dropped %d unserialisable events: %s", self.path, len(batch), e
                )
                return
            try:
                self._write(events)
            except OSError as e:
                self._failed = True
                log.warning("hora timeline %s: write failed (%s); the timeline stops recording", self.path, e)

    def _write(self, events: list[str]) -> None:
        """Make ``path`` hold ``events`` too; it stays a complete trace throughout. Called with ``_io_lock``."""
        if len(self._files) == 1:  # in place: a failed write is cut back to the last complete trace
            f = self._files[0]
            try:
                f.append(events)
            except OSError:
                f.restore()
                raise
            return
        other = self._files[1 - self._active]
        try:
            other.append(self._lag + events)  # not visible at path: a cut write here harms nothing
            os.link(self._real, self._swap_path2)  # keep the current file reachable ...
            os.rename(self._swap_path, self._real)  # ... while the complete new one replaces it atomically
            os.rename(self._swap_path2, self._swap_path)
        except OSError:
            _unlink(self._swap_path2)
            raise
        self._active = 1 - self._active
        self._lag = events

    def _serialise(self, batch: list[_Event]) -> list[str]:
        """One JSON object per event (formatted by hand: the writer thread's time is the timeline's cost)."""
        t0 = self._t0
        dumps = json.dumps
        quoted = self._quoted
        out: list[str] = []
        for ph, label, pid, ts_ns, args in batch:
            if ph == "M":
                out.append(
                    f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": {dumps(label)}}}}}'
                )
                out.append(
                    f'{{"name": "process_sort_index", "ph": "M", "pid": {pid}, "args": {{"sort_index": {pid}}}}}'
                )
                continue
            name = quoted.get(label)
            if name is None:
                name = quoted[label] = dumps(label)
            extra = ', "dur": 0' if ph == "X" else ', "s": "g"' if ph == "i" else ""
            if args:
                extra += ', "args": ' + _args_json(args)
            ts = (ts_ns - t0) / 1000
            out.append(f'{{"name": {name}, "ph": "{ph}", "ts": {ts!r}, "pid": {pid}, "tid": 0{extra}}}')
        return out


def request_args(req: Any) -> dict[str, str]:
    """A request's (:class:`~hora._engine.messages.Request`) arguments as the timeline shows them."""
    return {"dtype": req.dtype, "shape": str(req.shape)}


_GROUPED = ("grouped_allreduce.", "grouped_allgather.", "grouped_reducescatter.")


def track_label(name: str, kind: str | None) -> str:
    """Horovod's name for a tensor (``GetOpName`` in horovod/torch/mpi_ops_v2.cc): ``<op>.<name>`` for a named
    collective (``allreduce.grad.fc1``); an unnamed one's name (``allreduce.noname.3``) and a grouped tensor's
    (:func:`tensor_names`) already carry their op."""
    if kind is None or ".noname." in name or name.startswith(_GROUPED):
        return name
    return f"{kind}.{name}"


def tensor_names(req: Any) -> list[str]:
    """The tensors a request stands for, as the timeline shows them: its name, or for a grouped allreduce sent as
    one request (named after its first tensor, ``base.0``, with the tensors' sizes in ``splits``) every tensor's
    own name as Horovod gives it, ``grouped_allreduce.<base>_<i>of<n>``, so the timeline keeps a track per tensor
    as Horovod's does."""
    if req.splits is None or req.kind is not Kind.ALLREDUCE:
        return [req.name]
    base = req.name.removesuffix(".0")
    prefix = "" if base.startswith(_GROUPED) else "grouped_allreduce."
    n = len(req.splits)
    return [f"{prefix}{base}_{i + 1}of{n}" for i in range(n)]


def tensor_args(req: Any) -> list[dict[str, str]]:
    """:func:`request_args` for each of :func:`tensor_names`."""
    if req.splits is None or req.kind is not Kind.ALLREDUCE:
        return [request_args(req)]
    return [{"dtype": req.dtype, "shape": f"({n},)"} for n in req.splits]
