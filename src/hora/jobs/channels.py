"""The data channels of ``hora job``: staging inputs into ``input/data/<channel>`` and uploading artifacts.

The job runner calls, for each channel of each host::

    handle = stage_channel("train", "s3://bucket/train/", host_dir / "input/data/train",
                           input_mode="File", distribution="ShardedByS3Key",
                           host_index=0, host_count=2, progress=print)
    ...                                    # run the script
    handle.close()                         # stops a Pipe-mode thread, removes its FIFOs

and, for artifacts, ``upload(model_tar_gz, output_path)``.

* **Sources.** A local path (a file or a directory; an NFS/EFS/Lustre mount is just a path) or an
  ``s3://bucket/prefix`` URI (see :mod:`hora.jobs.s3` for credentials and the endpoint).
* **File mode** copies the host's objects into ``dest_dir``, keeping their paths relative to the source
  directory (to the S3 prefix), reporting :class:`TransferProgress` to ``progress`` at most every
  ``progress_interval`` seconds and once at the end.
* **Pipe mode** creates no copy: ``dest_dir.parent/<channel>_<epoch>`` FIFOs are fed by a thread as the script
  reads them (:mod:`hora.jobs.pipe_feeder`; the reader is :class:`hora.data.PipeDataset`).
* **Distribution.** ``FullyReplicated`` gives every host every object. ``ShardedByS3Key`` sorts the objects by key
  (by relative path for a local directory) and gives host ``i`` (0-based: ``algo-1`` is 0) of ``n`` the objects
  ``i, i + n, i + 2n, ...``: deterministic, disjoint, and together all of them.

Errors are :class:`hora.errors.ChannelError` naming the channel: a missing path, an S3 prefix with no objects, a
missing bucket, refused or missing credentials, an unreachable endpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from hora.errors import ChannelError, ConfigError, StorageError
from hora.jobs import s3
from hora.jobs.pipe_feeder import PipeFeeder, Readable

log = logging.getLogger(__name__)

__all__ = [
    "DISTRIBUTIONS",
    "FILE",
    "FULLY_REPLICATED",
    "INPUT_MODES",
    "PIPE",
    "SHARDED_BY_S3_KEY",
    "ChannelHandle",
    "SourceObject",
    "TransferProgress",
    "list_source",
    "shard",
    "stage_channel",
    "upload",
]

FILE, PIPE = "File", "Pipe"
INPUT_MODES = (FILE, PIPE)
FULLY_REPLICATED, SHARDED_BY_S3_KEY = "FullyReplicated", "ShardedByS3Key"
DISTRIBUTIONS = (FULLY_REPLICATED, SHARDED_BY_S3_KEY)
_CHUNK = 8 << 20


@dataclass(frozen=True)
class TransferProgress:
    """Where a copy stands: given to the ``progress`` callback of :func:`stage_channel` and :func:`upload`."""

    channel: str
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0

    def __str__(self) -> str:
        return (
            f"{self.channel}: {_human(self.bytes_done)} of {_human(self.bytes_total)} "
            f"({100 * self.fraction:.0f}%), {self.files_done}/{self.files_total} files"
        )


ProgressCallback = Callable[[TransferProgress], None]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class _Progress:
    """Counts bytes from any thread (S3 downloads call back from several) and reports at most every ``interval``."""

    def __init__(
        self, channel: str, total: int, files: int, callback: ProgressCallback | None, interval: float
    ):
        self.channel, self.total, self.files, self.callback, self.interval = (
            channel,
            total,
            files,
            callback,
            interval,
        )
        self.done = 0
        self.files_done = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            self._maybe_report(final=False)

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1
            self._maybe_report(final=self.files_done == self.files)

    def _maybe_report(self, final: bool) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if final or now - self._last >= self.interval:
            self._last = now
            self.callback(TransferProgress(self.channel, self.done, self.total, self.files_done, self.files))


@dataclass(frozen=True)
class SourceObject:
    """One file or S3 object of a channel: ``name`` is its path relative to the channel, in POSIX form."""

    name: str
    size: int
    path: Path | None = None  # a local file
    bucket: str | None = None  # or an S3 object
    key: str | None = None


class ChannelHandle:
    """A staged channel: where it is, what it holds, and (Pipe mode) the streaming thread to stop."""

    def __init__(
        self,
        name: str,
        input_mode: str,
        distribution: str,
        path: Path,
        objects: Sequence[SourceObject],
        feeder: PipeFeeder | None = None,
    ) -> None:
        self.name = name
        self.input_mode = input_mode
        self.distribution = distribution
        self.path = path
        self.files = tuple(o.name for o in objects)
        self.total_bytes = sum(o.size for o in objects)
        self._feeder = feeder

    def fifo_path(self, epoch: int) -> Path:
        """The FIFO a Pipe-mode script reads in ``epoch``: ``<data dir>/<channel>_<epoch>``."""
        return self.path.parent / f"{self.name}_{epoch}"

    @property
    def error(self) -> BaseException | None:
        """Why Pipe-mode streaming stopped, if it failed (None in File mode or while it is fine)."""
        return self._feeder.error if self._feeder is not None else None

    @property
    def epochs_completed(self) -> int:
        return self._feeder.epochs_completed if self._feeder is not None else 0

    def close(self, timeout: float = 5.0) -> None:
        """Stops Pipe-mode streaming and removes the FIFOs (returns within ``timeout``); nothing to do in File mode."""
        if self._feeder is not None:
            self._feeder.close(timeout)

    def __enter__(self) -> ChannelHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ChannelHandle({self.name!r}, {self.input_mode}, {self.distribution}, {str(self.path)!r}, "
            f"{len(self.files)} files, {self.total_bytes} bytes)"
        )


def stage_channel(
    name: str,
    source: str | os.PathLike[str],
    dest_dir: str | os.PathLike[str],
    *,
    input_mode: str,
    distribution: str,
    host_index: int,
    host_count: int,
    s3_endpoint_url: str | None = None,
    progress: ProgressCallback | None = None,
    progress_interval: float = 0.5,
) -> ChannelHandle:
    """Makes channel ``name`` from ``source`` available at ``dest_dir`` for host ``host_index`` of ``host_count``.

    Returns a :class:`ChannelHandle`; call its ``close()`` when the script has finished (Pipe mode).

    Raises:
        ChannelError: the source is missing or empty, S3 refused the request, or the destination is unusable.
        ConfigError: ``input_mode``, ``distribution`` or the host numbers are invalid.
    """
    if input_mode not in INPUT_MODES:
        raise ConfigError(f"channel {name!r}: input_mode {input_mode!r} is not one of {INPUT_MODES}")
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(f"channel {name!r}: distribution {distribution!r} is not one of {DISTRIBUTIONS}")
    if host_count < 1 or not 0 <= host_index < host_count:
        raise ConfigError(
            f"channel {name!r}: host_index {host_index} of host_count {host_count} is out of range "
            "(host_index counts from 0: algo-1 is 0)"
        )
    dest = Path(dest_dir)
    try:
        client = s3.make_client(s3_endpoint_url) if s3.is_s3_uri(source) else None
    except ConfigError as exc:
        raise ConfigError(f"channel {name!r}: {exc}") from exc
    try:
        objects = shard(list_source(source, client), distribution, host_index, host_count)
        if not objects:
            log.warning(
                "channel %r: host %d of %d gets no objects from %s", name, host_index, host_count, source
            )
        if input_mode == PIPE:
            feeder = PipeFeeder(name, dest.parent, objects, lambda obj: _open_source(obj, client))
            feeder.start()
            return ChannelHandle(name, input_mode, distribution, dest, objects, feeder)
        _copy(
            name,
            objects,
            dest,
            client,
            _Progress(name, sum(o.size for o in objects), len(objects), progress, progress_interval),
        )
        return ChannelHandle(name, input_mode, distribution, dest, objects)
    except StorageError as exc:
        raise ChannelError(f"channel {name!r}: {exc}") from exc
    except ConfigError as exc:  # a malformed s3:// URI
        raise ConfigError(f"channel {name!r}: {exc}") from exc
    except OSError as exc:
        raise ChannelError(f"channel {name!r}: staging {source} into {dest} failed: {exc}") from exc


def list_source(source: str | os.PathLike[str], client: Any = None) -> list[SourceObject]:
    """Every object of a local or S3 source, sorted by name.

    Raises:
        StorageError: the path does not exist, or the S3 prefix has no objects.
    """
    if s3.is_s3_uri(source):
        uri = s3.S3Uri.parse(str(source))
        if client is None:
            client = s3.make_client()
        found = s3.list_objects(client, uri)
        if not found:
            raise StorageError(
                f"no objects under {uri} (at {s3._endpoint_of(client)}); check the bucket and the prefix"
            )
        return [
            SourceObject(_relative_name(uri.prefix, o.key), o.size, bucket=uri.bucket, key=o.key)
            for o in found
        ]
    path = Path(source)
    if path.is_file():
        return [SourceObject(path.name, path.stat().st_size, path=path)]
    if not path.is_dir():
        raise StorageError(
            f"the path {path} does not exist (or is not a file or directory); fix the channel's path"
        )
    objects = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in files:
            p = Path(root) / f
            if p.is_file():  # skips sockets, FIFOs and broken links
                objects.append(SourceObject(p.relative_to(path).as_posix(), p.stat().st_size, path=p))
    if not objects:
        log.warning("the channel directory %s holds no files", path)
    objects.sort(key=lambda o: o.name)
    return objects


def shard(
    objects: Sequence[SourceObject], distribution: str, host_index: int, host_count: int
) -> list[SourceObject]:
    """The objects host ``host_index`` of ``host_count`` gets: all, or round-robin over the sorted names."""
    ordered = sorted(objects, key=lambda o: o.name)
    if distribution == SHARDED_BY_S3_KEY:
        return ordered[host_index::host_count]
    return ordered


def _relative_name(prefix: str, key: str) -> str:
    """Where an object under ``prefix`` lands inside the channel directory; refuses keys that would escape it."""
    if key == prefix:
        name = PurePosixPath(key).name
    elif not prefix or prefix.endswith("/"):
        name = key[len(prefix) :]
    elif key.startswith(prefix + "/"):
        name = key[len(prefix) + 1 :]
    else:  # the prefix ends inside a name ("data/tr" matched "data/train.csv"): keep it relative to its folder
        name = key[len(prefix.rpartition("/")[0]) :].lstrip("/")
    parts = PurePosixPath(name.lstrip("/")).parts
    if not parts or any(p in ("..", ".") for p in parts):
        raise StorageError(f"the S3 key {key!r} cannot be stored inside the channel directory")
    return PurePosixPath(*[p for p in parts if p]).as_posix()


def _open_source(obj: SourceObject, client: Any) -> Readable:
    if obj.path is not None:
        try:
            return open(obj.path, "rb")
        except OSError as exc:
            raise StorageError(f"reading {obj.path} failed: {exc}") from exc
    assert obj.bucket is not None and obj.key is not None
    return s3.open_object(client, obj.bucket, obj.key)


def _copy(name: str, objects: Sequence[SourceObject], dest: Path, client: Any, progress: _Progress) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for obj in objects:
        target = dest / obj.name
        target.parent.mkdir(parents=True, exist_ok=True)
        # A partial file never has the final name: a retried job re-stages cleanly, a script never reads half.
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            if obj.path is not None:
                with open(obj.path, "rb") as src, open(partial, "wb") as dst:
                    _copy_stream(src, dst, progress)
                shutil.copystat(obj.path, partial)
            else:
                assert obj.bucket is not None and obj.key is not None
                s3.download(client, obj.bucket, obj.key, str(partial), progress.add)
            os.replace(partial, target)
        finally:
            if partial.exists():
                partial.unlink()
        progress.file_done()
    if not objects:
        progress.file_done()  # still report once (0 of 0) so a caller's display ends


def _copy_stream(src: BinaryIO, dst: BinaryIO, progress: _Progress) -> None:
    while chunk := src.read(_CHUNK):
        dst.write(chunk)
        progress.add(len(chunk))


def upload(
    local_path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    s3_endpoint_url: str | None = None,
    progress: ProgressCallback | None = None,
) -> str:
    """Copies an artifact (a file, or a directory recursively) into ``dest``: a local directory or ``s3://`` URI.

    The artifact keeps its name: ``upload("model.tar.gz", "s3://b/jobs/j1/output")`` writes
    ``s3://b/jobs/j1/output/model.tar.gz``. Returns where it went.

    Raises:
        StorageError: the artifact is missing, or the destination refused it.
    """
    src = Path(local_path)
    if not src.exists():
        raise StorageError(f"cannot upload {src}: it does not exist")
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    names = [src.name] if src.is_file() else [f"{src.name}/{p.relative_to(src).as_posix()}" for p in files]
    tracker = _Progress(src.name, sum(p.stat().st_size for p in files), len(files), progress, 0.5)
    if s3.is_s3_uri(dest):
        uri = s3.S3Uri.parse(str(dest))
        client = s3.make_client(s3_endpoint_url)
        for path, name in zip(files, names):
            s3.upload_file(client, str(path), uri.child(name), tracker.add)
            tracker.file_done()
        return str(uri.child(src.name))
    target_dir = Path(dest)
    try:
        for path, name in zip(files, names):
            target = target_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.part")
            try:
                with open(path, "rb") as fsrc, open(partial, "wb") as fdst:
                    _copy_stream(fsrc, fdst, tracker)
                os.replace(partial, target)
            except OSError:
                partial.unlink(missing_ok=True)  # a partial copy is never left behind (nor its space taken)
                raise
            tracker.file_done()
    except OSError as exc:
        raise StorageError(f"uploading {src} to {target_dir} failed: {exc}") from exc
    return str(target_dir / src.name)
