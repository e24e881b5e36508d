"""A server's own checkpoints, for restarts (``hora run --max-restarts R --ps-checkpoint-dir DIR``).

Server ``i`` keeps its shards in ``DIR/ps<i>``: one ``.npz`` per shard (values, optimizer slots, update count ``t``,
as :mod:`hora.ps.checkpoint` writes them, atomically) and ``server.json`` naming each shard's file, what it was
registered with (shape, dtype, rule, consistency) and the ``t`` of its file, plus server 0's variable layouts. A
shard is saved when it is registered and then every ``steps`` updates applied to it: the state is copied under the
shard's lock when its update count reaches a multiple of ``steps`` (so in ``sync`` mode a checkpoint is exactly the
state after that step), and written by one background thread, the latest copy of a shard replacing an unwritten
older one. A restarted server (``--generation`` > 0) reads ``server.json`` back and serves the shards from there;
every worker's clock starts again at 0 (the consistency rules count from the restart). Updates applied after a
shard's last checkpoint are lost, as when TensorFlow or SageMaker restart from a checkpoint.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import threading
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np

from hora.ps import checkpoint
from hora.ps.messages import VariableLayout
from hora.ps.rules import parse_rule
from hora.ps.shard import Shard

if TYPE_CHECKING:
    from hora.ps.server import ParameterServer

__all__ = ["SERVER_MANIFEST", "ShardSaver", "restore_server", "server_dir"]

log = logging.getLogger(__name__)

SERVER_MANIFEST = "server.json"


def server_dir(directory: str, index: int) -> str:
    return os.path.join(directory, f"ps{index}")


class ShardSaver:
    """Checkpoints server ``index``'s shards in ``DIR/ps<index>`` (see the module docstring)."""

    def __init__(self, directory: str, index: int, steps: int, layouts: dict[str, VariableLayout]) -> None:
        self.dir = server_dir(directory, index)
        self.steps = steps
        self._layouts = layouts  # the server's own dict (server 0 fills it)
        self._entries: dict[str, dict[str, Any]] = {}
        self._queue: dict[tuple[str, int], tuple[dict[str, Any], dict[str, np.ndarray]]] = {}
        self._saved_t: dict[tuple[str, int], int] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.error: str = ""
        os.makedirs(self.dir, exist_ok=True)
        for stale in glob.glob(os.path.join(glob.escape(self.dir), ".tmp-*")):  # a write a killed server left
            with contextlib.suppress(OSError):
                os.unlink(stale)
        self._thread = threading.Thread(target=self._write_loop, name=f"hora-ps-{index}-save", daemon=True)
        self._thread.start()

    def forget(self) -> None:
        """Start this job's checkpoint: an empty manifest replaces the one an earlier job may have left (its shard
        files are replaced as shards save). From now on a restart that finds no manifest knows it was removed."""
        data = json.dumps({"format": 1, "shards": [], "layouts": {}}).encode()
        checkpoint.atomic_write(os.path.join(self.dir, SERVER_MANIFEST), lambda f: f.write(data))

    def registered(self, shard: Shard) -> None:
        """A new shard: save it now (update count 0, or what a restore put there)."""
        with shard.cond:
            self._offer(shard)

    def updated(self, shard: Shard) -> None:
        """After an update: save when the update count crossed a multiple of ``steps`` since the last save."""
        key = (shard.name, shard.index)
        with shard.cond:
            if shard.t // self.steps > self._saved_t.get(key, 0) // self.steps:
                self._offer(shard)

    def _offer(self, shard: Shard) -> None:  # the shard's lock is held: the copy is one consistent state
        key = (shard.name, shard.index)
        self._saved_t[key] = shard.t
        state = shard.state()
        with self._cond:
            self._queue[key] = (shard.describe(), state)
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until every copied state is on disk; True when it is."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._closed)
                if not self._queue:
                    return
                key, (describe, state) = self._queue.popitem()
                self._busy = True
            try:
                fname = checkpoint.shard_file(*key)
                checkpoint.atomic_write(os.path.join(self.dir, fname), lambda f, s=state: np.savez(f, **s))
                entry = {"name": key[0], "shard": key[1], "file": fname, "t": int(state["t"]), **describe}
                self._entries[f"{key[0]}\0{key[1]}"] = entry
                manifest = {
                    "format": 1,
                    "shards": sorted(self._entries.values(), key=lambda e: (e["name"], e["shard"])),
                    "layouts": {n: layout.to_json() for n, layout in list(self._layouts.items())},
                }
                data = json.dumps(manifest, indent=1, sort_keys=True).encode()
                checkpoint.atomic_write(os.path.join(self.dir, SERVER_MANIFEST), lambda f, d=data: f.write(d))
            except (OSError, ValueError) as exc:
                # a full disk must not stop the training: say it, keep serving
                if not self.error:
                    log.error("checkpoint of '%s' shard %d in %s failed: %s", key[0], key[1], self.dir, exc)
                self.error = f"checkpoint of '{key[0]}' shard {key[1]} in {self.dir} failed: {exc}"
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def restore_server(server: ParameterServer, saver: ShardSaver) -> int:
    """Load ``DIR/ps<i>`` into a restarted server before it serves; returns the number of shards restored (0
    when none was registered yet).

    Raises:
        ValueError: the manifest is missing (the first server of the job wrote one before it served, so the
            directory was emptied or removed since) or a file cannot be read: naming the file and what to do.
    """
    path = os.path.join(saver.dir, SERVER_MANIFEST)
    server.restored_from = saver.dir
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
        entries = list(manifest["shards"])
    except FileNotFoundError:
        raise ValueError(
            f"restore: the checkpoint manifest {path} is missing: the job's first server wrote it before serving, "
            f"so the directory was emptied or removed while the job ran and the server's values are lost; put "
            f"the directory back from a copy, or start the job again"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"restore: the checkpoint manifest {path} cannot be read ({exc}); {_DAMAGED}") from None
    shards = {}
    for e in entries:
        fname = str(e["file"])
        if os.path.basename(fname) != fname:
            raise ValueError(f"restore: {fname!r} in {path} is not a file name of the checkpoint")
        try:
            shard = _restored_shard(server, os.path.join(saver.dir, fname), e, path)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            # numpy says "allow_pickle=False" of any file that is not an .npz archive: misleading here
            why = "not an .npz archive" if "allow_pickle" in str(exc) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"restore: {os.path.join(saver.dir, fname)} cannot be read ({why}); {_DAMAGED}") from None
        shards[(shard.name, shard.index)] = shard
        saver._saved_t[(shard.name, shard.index)] = shard.t
        saver._entries[f"{shard.name}\0{shard.index}"] = dict(e)
    layouts = {
        n: VariableLayout.from_json(v, f"restore '{n}'") for n, v in manifest.get("layouts", {}).items()
    }
    server.adopt(shards, layouts)
    return len(shards)


#: What to do about a checkpoint that cannot be read.
_DAMAGED = (
    "the checkpoint is damaged (a disk error, or a file replaced by hand); restore it from a copy, or remove the "
    "server's directory to start it from scratch (its shards' values are then lost)"
)


def _restored_shard(server: ParameterServer, file: str, e: dict[str, Any], manifest: str) -> Shard:
    """The shard the manifest entry ``e`` describes, read from ``file`` (``.npz``, no pickles)."""
    with np.load(file, allow_pickle=False) as data:
        value = data["value"].astype(str(e["dtype"]), copy=True)
        if list(value.shape) != list(e["shape"]):
            raise ValueError(f"it holds shape {value.shape}, {manifest} says {e['shape']}")
        rule = parse_rule(e["rule"], "restore")
        shard = Shard(
            str(e["name"]), int(e["shard"]), value, rule, str(e["consistency"]), int(e["staleness"]), server.workers
        )
        shard.assign(value, {k: data[f"slot_{k}"] for k in shard.slots}, int(data["t"]))
    return shard
