"""Checkpoints of the servers' shards: one file per shard (values, optimizer slots, update count) plus a manifest.

Each server writes its own shards into the job's shared directory, each file atomically (a temporary file in the
same directory, fsync, rename), as ``.npz`` read back with ``allow_pickle=False``. The client that asked for the
checkpoint then writes ``manifest.json`` (atomically too) naming every variable's shape, dtype, row offsets and
files: a checkpoint without a manifest is incomplete and is never restored. Restoring onto another number of
servers (or another partitioning) re-shards: each new shard is assembled from the row ranges of the old shard
files that overlap it.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hora.errors import ConfigError
from hora.ps.messages import Piece, SavedShard, ShardSource

if TYPE_CHECKING:
    from hora.ps.shard import Shard

__all__ = [
    "MANIFEST",
    "atomic_write",
    "load_shards",
    "read_manifest",
    "reshard_sources",
    "save_shards",
    "write_manifest",
]

MANIFEST = "manifest.json"


def _atomic_write(path: str, write: Any) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


atomic_write = _atomic_write  # for the servers' own checkpoints (hora.ps.autosave)


def shard_file(name: str, index: int) -> str:
    return f"{urllib.parse.quote(name, safe='')}.shard{index}.npz"


def save_shards(directory: str, server: int, shards: Mapping[tuple[str, int], Shard]) -> list[SavedShard]:
    """Write every shard of this server; returns what it wrote where."""
    os.makedirs(directory, exist_ok=True)
    out = []
    for (name, index), shard in sorted(shards.items()):
        state = shard.state()
        fname = shard_file(name, index)
        _atomic_write(os.path.join(directory, fname), lambda f, s=state: np.savez(f, **s))
        out.append(SavedShard(name, index, fname, server))
    return out


def write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    _atomic_write(os.path.join(directory, MANIFEST), lambda f: f.write(data))


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, "rb") as f:
            manifest: dict[str, Any] = json.loads(f.read())
    except FileNotFoundError:
        raise ConfigError(
            f"no parameter-server checkpoint in {directory}: {MANIFEST} is missing (an incomplete save?)"
        ) from None
    return manifest


def reshard_sources(old: dict[str, Any], new_offsets: list[int]) -> list[list[Piece]]:
    """For each new shard (rows ``new_offsets[i]..new_offsets[i+1]``), the pieces of the old shard files that make
    it up (``old``: the variable in the manifest)."""
    old_offsets, files = old["offsets"], old["files"]
    out = []
    for i in range(len(new_offsets) - 1):
        lo, hi = new_offsets[i], new_offsets[i + 1]
        pieces = []
        for j in range(len(old_offsets) - 1):
            a, b = max(lo, old_offsets[j]), min(hi, old_offsets[j + 1])
            if a < b:
                pieces.append(Piece(str(files[j]), a - old_offsets[j], b - old_offsets[j], a - lo))
        out.append(pieces)
    return out


def load_shards(
    directory: str, shards: Mapping[tuple[str, int], Shard], sources: Sequence[ShardSource]
) -> None:
    """Fill the named shards from the pieces of old shard files (see :func:`reshard_sources`)."""
    for src in sources:
        key = (src.name, src.shard)
        shard = shards.get(key)
        if shard is None:
            raise KeyError(f"restore: this server holds no shard {key[1]} of '{key[0]}'")
        value = np.empty_like(shard.value)
        slots = {k: np.empty_like(v) for k, v in shard.slots.items()}
        t = 0
        for fname, lo, hi, dst in src.pieces:
            if os.path.basename(fname) != fname:
                raise ValueError(f"restore: {fname!r} is not a file name of the checkpoint")
            with np.load(os.path.join(directory, fname), allow_pickle=False) as data:
                n = hi - lo
                value[dst : dst + n] = data["value"][lo:hi]
                for k in slots:
                    slots[k][dst : dst + n] = data[f"slot_{k}"][lo:hi]
                t = max(t, int(data["t"]))
        shard.assign(value, slots, t)
