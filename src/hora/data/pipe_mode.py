"""Reading the records of a ``hora job`` Pipe-mode channel: :class:`PipeDataset`.

In Pipe mode (see docs/channels.md) a channel named ``train`` appears to the training script as FIFOs
``<input dir>/data/train_0``, ``train_1``, ... one per epoch, SageMaker's naming. The job runner feeds each FIFO from
a streaming thread as the script reads it and creates the next one once the previous has been read to its end (or
closed early). ``PipeDataset`` opens the FIFO of the next epoch each time it is iterated and yields its records::

    from hora.data import PipeDataset

    ds = PipeDataset("train", record_format="tfrecord")
    for epoch in range(3):
        for record in ds:          # epoch 0, then 1, then 2: a new FIFO each time
            ...

Record formats:

* ``"text"``: newline-delimited lines, yielded as ``str`` without the line ending (``bytes`` if
  ``encoding=None``).
* ``"tfrecord"``: TFRecord framing, yielded as ``bytes``: ``uint64`` length (little-endian), masked CRC-32C of
  the length, the data, masked CRC-32C of the data. A CRC mismatch or a truncated record raises
  :class:`hora.errors.RecordError` naming the file and the byte offset of the record.
* ``"recordio"``: MXNet's RecordIO framing (SageMaker's ``application/x-recordio`` and
  ``application/x-recordio-protobuf``), yielded as ``bytes`` (:mod:`hora.data.recordio`).

``channel`` is a channel name (resolved from ``SM_CHANNEL_<NAME>``, else ``SM_INPUT_DIR``, else ``/opt/ml/input``),
a channel path such as the value of ``SM_CHANNEL_TRAIN`` (its FIFOs are ``<path>_<epoch>``), or a regular file or
FIFO, read as is on every iteration (handy for testing a script locally). Nothing here blocks forever: waiting for
a FIFO to appear and waiting for data on it both give up after ``timeout`` seconds with an error.

A FIFO has one reader: with several processes per host, read the channel from one process per host (or use File
mode), as on SageMaker.
"""

from __future__ import annotations

import io
import os
import select
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from hora.config.variables import read, sm_channel_dir
from hora.data.recordio import iter_recordio
from hora.data.tfrecord import iter_tfrecords
from hora.errors import ChannelError, ConfigError, TimeoutError

__all__ = ["RECORD_FORMATS", "PipeDataset"]

RECORD_FORMATS = ("text", "tfrecord", "recordio")
_POLL_S = 0.5


class _FifoReader(io.RawIOBase):
    """The read end of a FIFO opened without blocking, so a writer that never comes costs a timeout, not a hang.

    Before the first writer has connected, Linux reports a non-blocking FIFO as readable at EOF; ``poll`` instead
    waits until data arrives or a writer that had connected hangs up, so every read is preceded by a poll.
    """

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__()
        self.path = path
        self.timeout = timeout
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN | select.POLLHUP)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no data arrived on the Pipe-mode FIFO {self.path} for {self.timeout:g} s; the job runner's "
                    "streaming thread has stalled or stopped (see the job's log), or raise PipeDataset's timeout"
                )
            if not self._poll.poll(min(remaining, _POLL_S) * 1000):
                continue
            try:
                data = os.read(self.fd, len(buffer))
            except BlockingIOError:
                continue
            buffer[: len(data)] = data
            return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


class PipeDataset:
    """Iterates the records of a Pipe-mode channel, one epoch (one FIFO) per iteration.

    Args:
        channel: a channel name, a channel path, or a regular file / FIFO (see the module docstring).
        record_format: ``"text"`` (newline-delimited), ``"tfrecord"`` or ``"recordio"``.
        epoch: the epoch the first iteration reads (default 0); each later iteration reads the next one. Ignored
            when ``channel`` is a regular file or a FIFO, which is read as is every time.
        timeout: seconds to wait for an epoch's FIFO to appear, and for data once it is open.
        check_crc: verify TFRecord CRCs (both per record).
        encoding: how text records are decoded; ``None`` yields ``bytes``.
    """

    def __init__(
        self,
        channel: str | os.PathLike[str],
        *,
        record_format: str = "text",
        epoch: int | None = None,
        timeout: float = 600.0,
        check_crc: bool = True,
        encoding: str | None = "utf-8",
    ) -> None:
        if record_format not in RECORD_FORMATS:
            raise ConfigError(
                f"PipeDataset record_format {record_format!r} is not supported; use one of {RECORD_FORMATS}"
            )
        if epoch is not None and (not isinstance(epoch, int) or epoch < 0):
            raise ConfigError(f"PipeDataset epoch must be a non-negative int or None, not {epoch!r}")
        if timeout <= 0:
            raise ConfigError(f"PipeDataset timeout must be positive, not {timeout!r}")
        self.record_format = record_format
        self.epoch = 0 if epoch is None else epoch
        self.timeout = float(timeout)
        self.check_crc = check_crc
        self.encoding = encoding
        self._fixed, self._base = _resolve(os.fspath(channel))

    def fifo_path(self, epoch: int) -> Path:
        """The FIFO of ``epoch`` (or the fixed file this dataset reads)."""
        return self._fixed if self._fixed is not None else Path(f"{self._base}_{epoch}")

    def __iter__(self) -> Iterator[bytes | str]:
        path = self.fifo_path(self.epoch)
        if self._fixed is None:
            self.epoch += 1  # an abandoned epoch is over too: the runner moves on when its FIFO is closed
        return self._records(path)

    def _records(self, path: Path) -> Iterator[bytes | str]:
        stream = self._open(path)
        try:
            if self.record_format == "tfrecord":
                yield from iter_tfrecords(stream, source=str(path), check_crc=self.check_crc)
            elif self.record_format == "recordio":
                yield from iter_recordio(stream, source=str(path))
            else:
                yield from _lines(stream, self.encoding)
            _raise_feeder_error(path)
        finally:
            stream.close()

    def _open(self, path: Path) -> BinaryIO:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                mode = path.stat().st_mode
                break
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the Pipe-mode FIFO {path} did not appear within {self.timeout:g} s: is the channel in "
                        "Pipe mode (input_mode: Pipe) and the job running? For local testing pass a file path"
                    ) from None
                time.sleep(0.05)
        if stat.S_ISFIFO(mode):
            return io.BufferedReader(_FifoReader(path, self.timeout), buffer_size=1 << 20)
        if stat.S_ISREG(mode):
            return open(path, "rb")
        raise ConfigError(f"PipeDataset: {path} is neither a FIFO nor a regular file")


def _lines(stream: BinaryIO, encoding: str | None) -> Iterable[bytes | str]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line if encoding is None else line.decode(encoding)


def _raise_feeder_error(path: Path) -> None:
    # The runner writes this marker before closing a FIFO whose source failed mid-epoch, so the end of the stream
    # is not mistaken for the end of the data.
    marker = path.with_name(f".{path.name}.error")
    try:
        message = marker.read_text()
    except OSError:
        return
    raise ChannelError(f"the Pipe-mode stream {path} stopped early: {message}")


def _resolve(channel: str) -> tuple[Path | None, str]:
    """(a fixed file to read, or None) and the FIFO path prefix ``<dir>/<name>``."""
    path = Path(channel)
    if os.sep in channel or path.exists():
        if path.exists() and (path.is_file() or stat.S_ISFIFO(path.stat().st_mode)):
            return path, str(path)
        return None, str(path)
    if not channel:
        raise ConfigError("PipeDataset needs a channel name or path, got ''")
    env_path = sm_channel_dir(channel)
    if env_path:
        return None, str(Path(env_path).parent / channel)
    input_dir = read("SM_INPUT_DIR") or "/opt/ml/input"
    return None, str(Path(input_dir) / "data" / channel)
