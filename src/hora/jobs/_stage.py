"""Where the job runner hands data in and out: channels, artifacts, checkpoints.

The real implementations live in :mod:`hora.jobs.channels` (File and Pipe mode, S3 with a configurable endpoint,
ShardedByS3Key, progress for large copies). The runner calls only the four functions below; until
``hora.jobs.channels`` exists they fall back to what needs no S3 and no FIFOs: File mode from a local path, and
local destinations.

The interface expected from ``hora.jobs.channels``::

    stage_channel(channel: ChannelSpec, data_dir: Path, host_index: int, host_count: int,
                  progress: Callable[[str], None]) -> Closeable | None
        Make ``channel`` available to one host. ``data_dir`` is the host's ``input/data`` directory: File mode
        fills ``data_dir/<channel.name>/``; Pipe mode creates the FIFOs ``data_dir/<channel.name>_<epoch>`` and
        starts feeding them. ``host_index``/``host_count`` select the host's share for ShardedByS3Key.
        File channels are staged once per job; Pipe channels once per attempt (a retry reads from the start),
        and the runner closes the returned object after that attempt's ranks have exited.
        ``progress`` takes human-readable progress lines. Returns an object whose ``close()`` the runner calls
        after the job's ranks have exited (to stop Pipe feeders), or None. Raises ConfigError (or any HoraError)
        with a clear message when the data cannot be staged.
    upload(path: Path, dest: str) -> str
        Copy the file ``path`` to ``dest`` (a local directory or an ``s3://bucket/prefix``), keeping its name;
        return where it went.
    download_dir(uri: str, directory: Path) -> None / upload_dir(directory: Path, uri: str) -> None
        Checkpoint sync between an ``s3://`` prefix and a host's ``checkpoints/`` directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hora.errors import ConfigError
from hora.jobs.spec import ChannelSpec

__all__ = ["download_dir", "stage_channel", "upload", "upload_dir"]


class Closeable(Protocol):
    def close(self) -> None: ...


def _channels() -> Any:
    try:
        from hora.jobs import channels  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return None
    return channels


def _needs_channels(what: str) -> ConfigError:
    return ConfigError(f"{what} needs hora.jobs.channels, which this build of hora does not have yet")


def stage_channel(
    channel: ChannelSpec, data_dir: Path, host_index: int, host_count: int, progress: Callable[[str], None]
) -> Closeable | None:
    impl = _channels()
    if impl is not None:
        return impl.stage_channel(channel, data_dir, host_index, host_count, progress)
    if channel.is_s3:
        raise _needs_channels(f"channel {channel.name!r} from {channel.uri}")
    if channel.input_mode == "Pipe":
        raise _needs_channels(f"channel {channel.name!r} in Pipe mode")
    if channel.distribution != "FullyReplicated":
        raise _needs_channels(f"channel {channel.name!r} with {channel.distribution}")
    dest = data_dir / channel.name
    src = Path(channel.uri)
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / src.name)
    return None


def upload(path: Path, dest: str) -> str:
    if dest.startswith("s3://"):
        impl = _channels()
        if impl is None:
            raise _needs_channels(f"uploading {path.name} to {dest}")
        return impl.upload(path, dest)
    target = Path(dest)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target / path.name)
    return str(target / path.name)


def download_dir(uri: str, directory: Path) -> None:
    if uri.startswith("s3://"):
        impl = _channels()
        if impl is None:
            raise _needs_channels(f"checkpoints from {uri}")
        impl.download_dir(uri, directory)
    elif Path(uri).is_dir():
        shutil.copytree(uri, directory, dirs_exist_ok=True)


def upload_dir(directory: Path, uri: str) -> None:
    if uri.startswith("s3://"):
        impl = _channels()
        if impl is None:
            raise _needs_channels(f"checkpoints to {uri}")
        impl.upload_dir(directory, uri)
    else:
        shutil.copytree(directory, uri, dirs_exist_ok=True)
