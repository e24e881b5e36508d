"""A server's own checkpoints (hora.ps.autosave), in this process with a real client over loopback TCP: a shard is
saved when registered and every N updates (values, Adam's slots, the update count); a new server restores exactly
that state and keeps training from it; a new job's server forgets what an earlier job left."""

from __future__ import annotations

import json
import os

import numpy as np

from hora._runtime.auth import new_secret
from hora.ps.autosave import SERVER_MANIFEST, ShardSaver, restore_server
from hora.ps.client import Client
from hora.ps.rules import apply_dense, new_slots, parse_rule
from hora.ps.server import ParameterServer

RULE = {"rule": "adam", "lr": 0.1}


def _server(secret, tmp_path, steps):
    server = ParameterServer(secret, 0, 1, op_timeout=30.0)
    server.saver = ShardSaver(str(tmp_path), 0, steps, server._layouts)
    return server


def test_a_restored_server_holds_the_last_checkpoint_and_trains_on_from_it(tmp_path):
    secret = new_secret()
    grads = [np.full((4, 3), i + 1, np.float32) for i in range(7)]
    server = _server(secret, tmp_path, steps=3)
    try:
        with Client([server.start()], secret, 0, timeout=30.0, shm=False) as c:
            c.register("w", np.arange(12, dtype=np.float32).reshape(4, 3), rule=RULE)
            for g in grads:
                c.push("w", g)  # updates 1..7: checkpoints after registering, after 3 and after 6
        assert server.saver.flush(30.0) and not server.saver.error
    finally:
        server.shutdown()
    with open(os.path.join(tmp_path, "ps0", SERVER_MANIFEST)) as f:
        manifest = json.load(f)
    assert [(e["name"], e["shard"], e["t"], e["consistency"]) for e in manifest["shards"]] == [("w", 0, 6, "async")]

    # the reference: the same six updates in one process; the restored server must hold exactly that
    rule = parse_rule(RULE)
    value, slots = np.arange(12, dtype=np.float32).reshape(4, 3), new_slots(rule, (4, 3), np.dtype(np.float32))
    for t, g in enumerate(grads[:6], 1):
        apply_dense(rule, value, g, slots, t)
    restarted = _server(secret, tmp_path, steps=3)
    try:
        assert restore_server(restarted, restarted.saver) == 1
        with Client([restarted.start()], secret, 0, timeout=30.0, shm=False) as c:
            c.register("w", np.zeros((4, 3), np.float32), rule=RULE)  # a retried registration keeps the restored state
            np.testing.assert_array_equal(c.pull("w"), value)
            apply_dense(rule, value, grads[6], slots, 7)  # Adam's slots and step came back too
            np.testing.assert_array_equal(c.push_pull("w", grads[6]), value)
    finally:
        restarted.shutdown()

    fresh = _server(secret, tmp_path, steps=3)  # generation 0 of another job
    try:
        fresh.saver.forget()
        assert restore_server(fresh, fresh.saver) == 0
    finally:
        fresh.shutdown()


def test_a_damaged_checkpoint_is_named_and_a_killed_writes_leftover_is_removed(tmp_path):
    """Issue 27, item 7: a corrupt .npz gave numpy's misleading allow_pickle message, naming no file; a server
    killed mid-write left a 0-byte .tmp-*.npz behind."""
    import pytest

    secret = new_secret()
    server = _server(secret, tmp_path, steps=1)
    try:
        with Client([server.start()], secret, 0, timeout=30.0, shm=False) as c:
            c.register("w", np.zeros(4, np.float32), rule="sgd")
        assert server.saver.flush(30.0) and not server.saver.error
    finally:
        server.shutdown()
    [npz] = [n for n in os.listdir(tmp_path / "ps0") if n.endswith(".npz")]
    (tmp_path / "ps0" / npz).write_bytes(b"not a zip file at all")
    (tmp_path / "ps0" / ".tmp-half.npz").write_bytes(b"")
    restarted = _server(secret, tmp_path, steps=1)
    try:
        assert not (tmp_path / "ps0" / ".tmp-half.npz").exists()
        with pytest.raises(ValueError) as info:
            restore_server(restarted, restarted.saver)
        assert str(info.value).startswith(f"restore: {tmp_path / 'ps0' / npz} cannot be read (")
        assert "the checkpoint is damaged" in str(info.value) and "allow_pickle" not in str(info.value)
        (tmp_path / "ps0" / SERVER_MANIFEST).write_text("{not json")
        with pytest.raises(ValueError, match=r"the checkpoint manifest .*server.json cannot be read|manifest .* cannot"):
            restore_server(restarted, restarted.saver)
    finally:
        restarted.shutdown()


def test_a_restart_without_its_checkpoint_fails_instead_of_serving_nothing(tmp_path):
    """Issue 27, item 7: a restart whose checkpoint directory was emptied served with no shards, and the workers
    were told to "register the variable first"."""
    import pytest

    secret = new_secret()
    server = _server(secret, tmp_path, steps=1)
    server.saver.forget()  # generation 0: the job's manifest exists before anything is served
    try:
        assert json.loads((tmp_path / "ps0" / SERVER_MANIFEST).read_text())["shards"] == []
        with Client([server.start()], secret, 0, timeout=30.0, shm=False) as c:
            c.register("w", np.zeros(4, np.float32), rule="sgd")
        assert server.saver.flush(30.0) and not server.saver.error
    finally:
        server.shutdown()
    manifest = (tmp_path / "ps0" / SERVER_MANIFEST).read_text()
    for name in os.listdir(tmp_path / "ps0"):
        os.unlink(tmp_path / "ps0" / name)
    restarted = _server(secret, tmp_path, steps=1)
    try:
        with pytest.raises(ValueError) as info:
            restore_server(restarted, restarted.saver)
        assert str(info.value).startswith(f"restore: the checkpoint manifest {tmp_path / 'ps0' / SERVER_MANIFEST} is")
        assert "emptied or removed while the job ran" in str(info.value)
    finally:
        restarted.shutdown()

    # a shard registered but never saved (the server died first): the workers learn its values are lost
    (tmp_path / "ps0" / SERVER_MANIFEST).write_text(json.dumps({**json.loads(manifest), "shards": []}))
    restarted = _server(secret, tmp_path, steps=1)
    try:
        assert restore_server(restarted, restarted.saver) == 0
        with pytest.raises(KeyError, match=r"it was restarted and its checkpoint .* has none .* lost"):
            restarted.shard("w", 0)  # what a worker's push or pull of 'w' asks the server for
    finally:
        restarted.shutdown()
