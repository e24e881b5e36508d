"""Checkpoint sync of a multi-host job: every host restores every host's checkpoints, and only what a host changed
since (or since its last sync) goes out, so an untouched copy of another host's file never overwrites it."""

from __future__ import annotations

import os
from pathlib import Path

from hora.jobs._stage import restore_checkpoints, upload_changed


def test_only_what_a_host_changed_goes_out_and_a_stale_copy_never_overwrites_another_hosts_file(tmp_path):
    remote = tmp_path / "checkpoint_path"
    (remote / "nested").mkdir(parents=True)
    (remote / "epoch-algo-1").write_text("16")
    (remote / "nested" / "epoch-algo-2").write_text("7")
    hosts = {h: tmp_path / h / "checkpoints" for h in ("algo-1", "algo-2")}
    synced = {}
    for h, d in hosts.items():
        d.mkdir(parents=True)
        synced[h] = restore_checkpoints(str(remote), d)  # both hosts get both files
        assert sorted(synced[h]) == ["epoch-algo-1", "nested/epoch-algo-2"]
    (hosts["algo-1"] / "epoch-algo-1").write_text("40")  # each host moves its own file on
    (hosts["algo-2"] / "nested" / "epoch-algo-2").write_text("9")
    for h, d in hosts.items():  # algo-2 last: its untouched copy of epoch-algo-1 (16) must not go out
        synced[h] = upload_changed(d, str(remote), synced[h])
    assert (remote / "epoch-algo-1").read_text() == "40"
    assert (remote / "nested" / "epoch-algo-2").read_text() == "9"
    # what is in sync is not sent again: a file changed out there meanwhile stays as it is
    (remote / "epoch-algo-1").write_text("changed elsewhere")
    synced["algo-1"] = upload_changed(hosts["algo-1"], str(remote), synced["algo-1"])
    assert (remote / "epoch-algo-1").read_text() == "changed elsewhere"
    st = (hosts["algo-1"] / "epoch-algo-1").stat()  # a rewrite (new mtime) goes out again
    os.utime(hosts["algo-1"] / "epoch-algo-1", ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    upload_changed(hosts["algo-1"], str(remote), synced["algo-1"])
    assert (remote / "epoch-algo-1").read_text() == "40"


def test_nothing_to_restore_is_an_empty_start(tmp_path):
    d = tmp_path / "checkpoints"
    d.mkdir()
    assert restore_checkpoints(str(tmp_path / "none-yet"), d) == {}
    (d / "a").write_text("x")
    assert upload_changed(d, str(tmp_path / "out"), {}) == {"a": (1, (d / "a").stat().st_mtime_ns)}
    assert Path(tmp_path / "out" / "a").read_text() == "x"
