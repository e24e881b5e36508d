"""Where the job runner hands data in and out: channels, artifacts, checkpoints.

A thin adapter from the job runner's view (a :class:`ChannelSpec`, a host's ``input/data`` directory, progress as
text lines) onto :mod:`hora.jobs.channels`, which does the work: File and Pipe mode from local paths or ``s3://``
(endpoint from ``HORA_S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``), ShardedByS3Key, progress for large copies, and
artifact upload (the runner calls ``channels.upload`` itself).

- ``stage_channel``: File mode fills ``data_dir/<channel>/``; Pipe mode creates the FIFOs
  ``data_dir/<channel>_<epoch>`` and feeds them. The runner closes the returned handle after the attempt's ranks
  have exited (it stops Pipe feeders).
- ``restore_checkpoints`` / ``upload_changed``: checkpoint sync between a host's ``checkpoints/`` and
  ``checkpoint_path`` (out: only the files the host changed since the restore).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hora.jobs import channels, s3
from hora.jobs.channels import ChannelHandle, TransferProgress
from hora.jobs.remote_spec import Manifest, manifest
from hora.jobs.spec import ChannelSpec

__all__ = ["download_dir", "restore_checkpoints", "stage_channel", "upload_changed"]


def _lines(what: str, progress: Callable[[str], None] | None) -> Callable[[TransferProgress], None] | None:
    if progress is None:
        return None
    return lambda p: progress(f"{what}: {p}")


def stage_channel(
    channel: ChannelSpec, data_dir: Path, host_index: int, host_count: int, progress: Callable[[str], None]
) -> ChannelHandle:
    return channels.stage_channel(
        channel.name,
        channel.uri,
        data_dir / channel.name,
        input_mode=channel.input_mode,
        distribution=channel.distribution,
        host_index=host_index,
        host_count=host_count,
        progress=_lines(f"channel {channel.name}", progress),
    )


def download_dir(uri: str, directory: Path) -> None:
    """Fill ``directory`` from the checkpoints at ``uri`` (nothing to do when there are none yet)."""
    if s3.is_s3_uri(uri):
        client = s3.make_client()
        if not s3.list_objects(client, s3.S3Uri.parse(uri)):
            return
    elif not Path(uri).is_dir():
        return
    channels.stage_channel(
        "checkpoints", uri, directory, input_mode="File", distribution="FullyReplicated", host_index=0, host_count=1
    )


def restore_checkpoints(uri: str, directory: Path) -> Manifest:
    """:func:`download_dir`, and what it restored (each file's size and modification time): a file that still
    matches is not the host's to sync out (:func:`upload_changed`)."""
    download_dir(uri, directory)
    return manifest(directory)


def upload_changed(directory: Path, uri: str, synced: Manifest) -> Manifest:
    """Copy the files of ``directory`` that differ from ``synced`` to ``uri`` (a local directory or an ``s3://``
    prefix), as SageMaker syncs only what changed: every host restores every host's checkpoints, and an untouched
    copy of another host's file would overwrite that host's newer one. ``synced``: what :func:`restore_checkpoints`
    restored, or what the last call returned (what is now in sync)."""
    now = manifest(directory)
    for rel, meta in sorted(now.items()):
        if synced.get(rel) != meta:
            parent = rel.rpartition("/")[0]
            channels.upload(directory / rel, f"{uri.rstrip('/')}/{parent}" if parent else uri)
    return {**synced, **now}
