"""The writer side of Pipe mode: a thread that feeds a channel's per-epoch FIFOs from its source as it is read.

For channel ``train`` staged at ``<data>/train``, epoch ``e`` is the FIFO ``<data>/train_<e>`` (SageMaker's naming).
The feeder creates ``train_0``, waits for a reader, streams every source object into it in order (raw bytes,
concatenated, a chunk at a time: nothing is staged on disk), creates ``train_1``, closes and removes ``train_0``,
and so on, for as many epochs as the script reads. A reader that closes a FIFO early ends that epoch. If the source
fails mid-epoch, or the feeder is closed while a reader is mid-epoch, the feeder writes the reason to
``.train_<e>.error`` before closing the FIFO, so the reader (:class:`hora.data.PipeDataset`) raises instead of
mistaking the cut for the end of the data.

Nothing blocks forever: the FIFO is opened for writing with ``O_NONBLOCK`` (retried until a reader comes) and
every write waits with ``poll`` in short slices, so :meth:`PipeFeeder.close` stops the thread promptly whether or
not a reader ever came.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = ["PipeFeeder", "Readable"]

_POLL_MS = 100
_READER_WAIT_S = 0.05
_PIPE_SIZE = 1 << 20  # the most an unprivileged process may ask for by default (/proc/sys/fs/pipe-max-size)


class Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...

    def close(self) -> None: ...


class _Stopped(Exception):
    pass


class PipeFeeder:
    """Feeds ``<directory>/<channel>_<epoch>`` FIFOs from ``sources`` (opened with ``open_source``) in a thread."""

    def __init__(
        self,
        channel: str,
        directory: Path,
        sources: Sequence[Any],
        open_source: Callable[[Any], Readable],
        *,
        chunk_size: int = 1 << 20,
    ) -> None:
        self.channel = channel
        self.directory = directory
        self.sources = list(sources)
        self.open_source = open_source
        self.chunk_size = chunk_size
        self.epochs_completed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._current: Readable | None = None
        self._created: set[Path] = set()
        self._thread = threading.Thread(target=self._run, name=f"hora-pipe-{channel}", daemon=True)

    def fifo_path(self, epoch: int) -> Path:
        return self.directory / f"{self.channel}_{epoch}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._make_fifo(0)  # before returning, so the script never starts before its first FIFO exists
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stops the thread (within ``timeout``) and removes the FIFOs it created.

        Error markers stay, so a reader still draining a FIFO learns why its stream ended; the next run's feeder
        removes them when it creates FIFOs of the same names.
        """
        self._stop.set()
        with self._lock:
            current = self._current
        if current is not None:
            try:
                current.close()  # unblocks a read from a slow source
            except Exception:
                pass
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "the Pipe-mode thread of channel %r did not stop within %g s", self.channel, timeout
                )
        with self._lock:
            created = sorted(self._created)
        for path in created:
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # -- the thread ---------------------------------------------------------------------------------------------

    def _make_fifo(self, epoch: int) -> None:
        path = self.fifo_path(epoch)
        try:
            if not stat.S_ISFIFO(path.lstat().st_mode):
                raise FileExistsError(
                    f"{path} exists and is not a FIFO; remove it or stage the job elsewhere"
                )
            path.unlink()  # left by an earlier run: a fresh FIFO, so no old reader shares it
        except FileNotFoundError:
            pass
        try:
            self._marker(path).unlink()  # an earlier run's failure is not this run's
        except FileNotFoundError:
            pass
        os.mkfifo(path, 0o600)
        with self._lock:
            self._created.add(path)

    @staticmethod
    def _marker(path: Path) -> Path:
        return path.with_name(f".{path.name}.error")

    def _run(self) -> None:
        epoch = 0
        while not self._stop.is_set():
            path = self.fifo_path(epoch)
            fd = self._wait_for_reader(path)
            if fd is None:
                return
            try:
                self._stream(fd)
                self.epochs_completed += 1
            except BrokenPipeError:
                log.debug("channel %r epoch %d: the reader closed the FIFO early", self.channel, epoch)
            except _Stopped:
                # The reader must not take the cut for the end of the epoch; the marker outlives close() for it.
                try:
                    self._marker(path).write_text(
                        f"channel {self.channel!r}: the job runner stopped streaming"
                    )
                except OSError:
                    pass
                os.close(fd)
                return
            except Exception as exc:
                self.error = exc
                log.error("channel %r: Pipe-mode streaming failed in epoch %d: %s", self.channel, epoch, exc)
                try:
                    self._marker(path).write_text(f"channel {self.channel!r}: {exc}")
                finally:
                    os.close(fd)
                return
            try:
                self._make_fifo(epoch + 1)
            except OSError as exc:
                self.error = exc
                log.error("channel %r: cannot create the FIFO of epoch %d: %s", self.channel, epoch + 1, exc)
                return
            finally:
                os.close(fd)
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            epoch += 1

    def _wait_for_reader(self, path: Path) -> int | None:
        while not self._stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                    self.error = exc
                    log.error("channel %r: cannot open %s: %s", self.channel, path, exc)
                    return None
                self._stop.wait(_READER_WAIT_S)
                continue
            try:
                fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_SIZE)  # fewer wake-ups per MB
            except OSError:
                pass  # a smaller limit on this machine: the default 64 KiB still works
            return fd
        return None

    def _stream(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        for source in self.sources:
            if self._stop.is_set():
                raise _Stopped
            stream = self.open_source(source)
            with self._lock:
                self._current = stream
            try:
                while chunk := stream.read(self.chunk_size):
                    self._write_all(fd, poller, memoryview(chunk))
            except Exception:
                if self._stop.is_set():
                    raise _Stopped from None
                raise
            finally:
                with self._lock:
                    self._current = None
                stream.close()

    def _write_all(self, fd: int, poller: select.poll, view: memoryview) -> None:
        while view:
            if self._stop.is_set():
                raise _Stopped
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                poller.poll(_POLL_MS)  # the pipe is full: wait until the reader makes room, or the next check
                continue
            view = view[n:]
