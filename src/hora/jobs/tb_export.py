"""TensorBoard export of a job: the script's TensorBoard directory synced to ``tensorboard_output_config``'s
destination while the job runs, and the parsed metrics written there as TensorBoard scalars.

Every host's ``container_local_output_path`` (on its own tree: ``/opt/ml/...`` is the host's ``hosts/algo-K/...``)
is mirrored into the destination, a local directory or an ``s3://`` prefix: files are added and updated, never
deleted (as SageMaker's upload). A file several hosts write under the same name is taken from the first host
(algo-1 first), as the archives do. A local file that only grew (TensorBoard's event files) is extended in place,
so a ``tensorboard --logdir`` reading the destination sees it grow; any other change replaces the file whole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hora.errors import HoraError, StorageError
from hora.jobs import s3
from hora.jobs.export_spec import TensorBoardOutputConfig, require
from hora.jobs.sagemaker_env import HostLayout
from hora.jobs.store import write_private

__all__ = ["CONFIG_FILE", "DirectorySync", "TensorBoardExport", "host_directory"]

#: Written into each host's input/config/, as SageMaker writes it for the Debugger (smdebug reads LocalPath there).
CONFIG_FILE = "tensorboardoutputconfig.json"
_CHUNK = 1 << 20


def host_directory(config: TensorBoardOutputConfig, layout: HostLayout) -> Path:
    """Where the host's script writes its TensorBoard files: ``/opt/ml/...`` is the host's own tree; any other
    path is this machine's, shared by every host."""
    local = config.local_path
    if local.startswith("/opt/ml/"):
        return layout.root / local[len("/opt/ml/"):]
    return Path(local)


class DirectorySync:
    """Mirrors the files under ``sources`` ((directory, name prefix) pairs, the first one winning a clash) into
    ``dest``, a local directory or an ``s3://`` prefix. Not thread-safe: one caller syncs."""

    def __init__(self, sources: list[tuple[Path, str]], dest: str, staging: Path) -> None:
        self.sources = sources
        self.dest = dest
        self.staging = staging  # snapshots of growing files, for S3 (an upload needs a file that holds still)
        self._copied: dict[str, tuple[int, int, int]] = {}  # name -> (inode, size, mtime) of the source copied
        self._client: Any = None

    def _files(self) -> dict[str, Path]:
        chosen: dict[str, Path] = {}
        for directory, prefix in self.sources:
            if not directory.is_dir():
                continue
            for path in sorted(directory.rglob("*")):
                if path.is_file() and not path.is_symlink():  # a link would copy what it points to (/etc/...)
                    chosen.setdefault(prefix + path.relative_to(directory).as_posix(), path)
        return chosen

    def sync(self) -> int:
        """Copy what is new or changed since the last call; returns how many files were copied.

        Raises:
            StorageError: the destination refused a file (the others are still tried first).
        """
        copied, problems = 0, []
        for name, path in self._files().items():
            try:
                st = path.stat()
            except FileNotFoundError:  # removed since the listing (a retry empties output/)
                continue
            now = (st.st_ino, st.st_size, st.st_mtime_ns)
            before = self._copied.get(name)
            if before == now:
                continue
            try:
                if s3.is_s3_uri(self.dest):
                    self._upload(name, path)
                else:
                    self._copy(name, path, before, now)
            except (OSError, HoraError) as exc:
                problems.append(f"{path} -> {name}: {exc}")
                continue
            self._copied[name] = now
            copied += 1
        if problems:
            raise StorageError(f"syncing TensorBoard files to {self.dest} failed for {len(problems)} file(s): "
                               + "; ".join(problems[:3]))
        return copied

    def _copy(self, name: str, path: Path, before: tuple[int, int, int] | None, now: tuple[int, int, int]) -> None:
        target = Path(self.dest) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        size = now[1]
        if (before is not None and before[0] == now[0] and size > before[1]
                and target.is_file() and target.stat().st_size == before[1]):
            with open(path, "rb") as src, open(target, "ab") as out:  # grew: append the new bytes only
                src.seek(before[1])
                _copy_bytes(src, out, size - before[1])
            return
        # not named after the file: TensorBoard reads every file with "tfevents" in its name, a partial one too
        partial = target.with_name(f".hora-copy-{os.getpid()}.part")
        try:
            with open(path, "rb") as src, open(partial, "wb") as out:
                _copy_bytes(src, out, size)
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def _upload(self, name: str, path: Path) -> None:
        if self._client is None:
            self._client = s3.make_client()
        self.staging.mkdir(parents=True, exist_ok=True)
        snapshot = self.staging / "upload.tmp"
        try:
            shutil.copyfile(path, snapshot)
            s3.upload_file(self._client, str(snapshot), s3.S3Uri.parse(self.dest).child(name))
        finally:
            snapshot.unlink(missing_ok=True)


def _copy_bytes(src: Any, out: Any, count: int) -> None:
    """``count`` bytes (the size seen when listing: a file still being written is copied as it was then)."""
    while count > 0:
        chunk = src.read(min(_CHUNK, count))
        if not chunk:
            break
        out.write(chunk)
        count -= len(chunk)


class TensorBoardExport:
    """The job's TensorBoard export: the hosts' directories prepared, the metric scalars written, both synced."""

    def __init__(self, config: TensorBoardOutputConfig, job_name: str, job_dir: Path,
                 layouts: list[HostLayout]) -> None:
        require("tensorboard")
        self.config = config
        self.layouts = layouts
        # the metrics' run: <dest>/<job_name>/ (one run per job, named after it, beside the script's own runs)
        self.run_dir = job_dir / "hora" / "tensorboard" / job_name
        self.dirs = list(dict.fromkeys(host_directory(config, layout) for layout in layouts))
        self.sync = DirectorySync([(self.run_dir, f"{job_name}/")] + [(d, "") for d in self.dirs],
                                  config.s3_output_path, job_dir / "hora" / "tensorboard-staging")
        self._writer: Any = None

    def prepare(self) -> None:
        """Each host's directory made, and its ``input/config/tensorboardoutputconfig.json`` written."""
        for layout in self.layouts:
            directory = host_directory(self.config, layout)
            directory.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"LocalPath": str(directory), "S3OutputPath": self.config.s3_output_path}, indent=2)
            write_private(layout.config_dir / CONFIG_FILE, text + "\n")

    def scalars(self, points: Iterable[tuple[str, float, int, float]]) -> None:
        """(tag, value, step, wall time) points, written to the metrics' event file."""
        for tag, value, step, wall_time in points:
            if self._writer is None:
                from tensorboard.summary import Writer

                self.run_dir.mkdir(parents=True, exist_ok=True)
                self._writer = Writer(str(self.run_dir))
            self._writer.add_scalar(tag, value, step, wall_time=wall_time)
        if self._writer is not None:
            self._writer.flush()

    def poll(self) -> int:
        """Sync what changed (a retry's emptied output/ gets its directory back first)."""
        for directory in self.dirs:
            directory.mkdir(parents=True, exist_ok=True)
        return self.sync.sync()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.sync.sync()
