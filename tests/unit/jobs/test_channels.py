"""File-mode channels from local paths: copies, sharding, progress, errors; artifact upload to a local directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hora.errors import ChannelError, ConfigError, StorageError
from hora.jobs.channels import (
    TransferProgress,
    _relative_name,
    list_source,
    shard,
    stage_channel,
    upload,
)


def _tree(root: Path, n: int = 10) -> dict[str, bytes]:
    files = {}
    for i in range(n):
        rel = f"part-{i:02d}.csv" if i % 3 else f"nested/deeper/part-{i:02d}.csv"
        data = os.urandom(100 + i * 37)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = data
    return files


def _stage(name, source, dest, **kw):
    kw.setdefault("input_mode", "File")
    kw.setdefault("distribution", "FullyReplicated")
    kw.setdefault("host_index", 0)
    kw.setdefault("host_count", 1)
    return stage_channel(name, source, dest, **kw)


def _contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_file_mode_copies_a_directory(tmp_path):
    files = _tree(tmp_path / "src")
    handle = _stage("train", tmp_path / "src", tmp_path / "input/data/train")
    assert _contents(tmp_path / "input/data/train") == files
    assert handle.files == tuple(sorted(files))
    assert handle.total_bytes == sum(len(v) for v in files.values())
    assert handle.input_mode == "File" and handle.path == tmp_path / "input/data/train"
    handle.close()  # nothing to stop in File mode


def test_file_mode_copies_a_single_file(tmp_path):
    (tmp_path / "train.csv").write_text("a,b\n1,2\n")
    _stage("train", tmp_path / "train.csv", tmp_path / "dest")
    assert _contents(tmp_path / "dest") == {"train.csv": b"a,b\n1,2\n"}


def test_restaging_overwrites_and_leaves_no_partial_files(tmp_path):
    files = _tree(tmp_path / "src", 4)
    _stage("train", tmp_path / "src", tmp_path / "dest")
    _stage("train", tmp_path / "src", tmp_path / "dest")
    assert _contents(tmp_path / "dest") == files


def test_sharded_by_key_across_three_hosts(tmp_path):
    files = _tree(tmp_path / "src", 10)
    shards = []
    for i in range(3):
        dest = tmp_path / f"algo-{i + 1}" / "train"
        handle = _stage(
            "train", tmp_path / "src", dest, distribution="ShardedByS3Key", host_index=i, host_count=3
        )
        got = _contents(dest)
        assert set(got) == set(handle.files)
        shards.append(got)
    names = [set(s) for s in shards]
    assert set().union(*names) == set(files)  # together: everything
    assert sum(len(n) for n in names) == len(files)  # disjoint
    for s in shards:
        assert all(files[k] == v for k, v in s.items())
    # Round-robin over the sorted names, SageMaker-style: host i gets i, i+3, i+6, ...
    ordered = sorted(files)
    assert [set(ordered[i::3]) for i in range(3)] == names
    assert [len(n) for n in names] == [4, 3, 3]


def test_fully_replicated_gives_every_host_everything(tmp_path):
    files = _tree(tmp_path / "src", 5)
    for i in range(3):
        _stage("train", tmp_path / "src", tmp_path / f"h{i}", host_index=i, host_count=3)
        assert _contents(tmp_path / f"h{i}") == files


def test_more_hosts_than_files_leaves_some_empty(tmp_path):
    _tree(tmp_path / "src", 2)
    handles = [
        _stage(
            "t",
            tmp_path / "src",
            tmp_path / f"h{i}",
            distribution="ShardedByS3Key",
            host_index=i,
            host_count=3,
        )
        for i in range(3)
    ]
    assert [len(h.files) for h in handles] == [1, 1, 0]
    assert (tmp_path / "h2").is_dir() and not list((tmp_path / "h2").iterdir())


def test_progress_is_reported_and_throttled(tmp_path):
    big = tmp_path / "src" / "big.bin"
    big.parent.mkdir()
    big.write_bytes(os.urandom(20 << 20))  # 20 MiB: three 8 MiB chunks
    (tmp_path / "src" / "small.bin").write_bytes(b"x" * 10)
    total = (20 << 20) + 10

    every: list[TransferProgress] = []
    _stage("train", tmp_path / "src", tmp_path / "a", progress=every.append, progress_interval=0)
    assert every[-1] == TransferProgress("train", total, total, 2, 2)
    assert [p.bytes_done for p in every] == sorted(p.bytes_done for p in every)
    assert len(every) >= 4  # each chunk and each file with no throttling
    assert "100%" in str(every[-1]) and "2/2 files" in str(every[-1])

    throttled: list[TransferProgress] = []
    _stage("train", tmp_path / "src", tmp_path / "b", progress=throttled.append, progress_interval=1e9)
    assert throttled == [TransferProgress("train", total, total, 2, 2)]  # only the final report


def test_a_missing_path_names_the_channel(tmp_path):
    with pytest.raises(ChannelError, match=r"channel 'train'.*does not exist"):
        _stage("train", tmp_path / "nope", tmp_path / "dest")


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"input_mode": "Stream"}, "input_mode 'Stream'"),
        ({"distribution": "Random"}, "distribution 'Random'"),
        ({"host_index": 3, "host_count": 3}, "host_index 3 of host_count 3"),
        ({"host_index": 0, "host_count": 0}, "host_count 0"),
    ],
)
def test_bad_arguments(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        _stage("train", tmp_path, tmp_path / "dest", **kw)


def test_list_source_and_shard_are_deterministic(tmp_path):
    _tree(tmp_path / "src", 7)
    a = shard(list_source(tmp_path / "src"), "ShardedByS3Key", 1, 2)
    b = shard(list(reversed(list_source(tmp_path / "src"))), "ShardedByS3Key", 1, 2)
    assert a == b


@pytest.mark.parametrize(
    "prefix,key,name",
    [
        ("train/", "train/a.csv", "a.csv"),
        ("train", "train/x/a.csv", "x/a.csv"),
        ("train/a.csv", "train/a.csv", "a.csv"),
        ("data/tr", "data/train.csv", "train.csv"),
        ("", "top.csv", "top.csv"),
        ("p/", "p//double.csv", "double.csv"),
    ],
)
def test_s3_keys_land_relative_to_the_prefix(prefix, key, name):
    assert _relative_name(prefix, key) == name


@pytest.mark.parametrize("key", ["p/../../etc/passwd", "p/a/../../../x", "p/.."])
def test_s3_keys_that_would_escape_are_refused(key):
    with pytest.raises(StorageError, match="cannot be stored"):
        _relative_name("p/", key)


def test_upload_to_a_local_directory(tmp_path):
    (tmp_path / "model.tar.gz").write_bytes(b"model-bytes")
    where = upload(tmp_path / "model.tar.gz", tmp_path / "out" / "job-1")
    assert where == str(tmp_path / "out" / "job-1" / "model.tar.gz")
    assert Path(where).read_bytes() == b"model-bytes"
    files = _tree(tmp_path / "ckpt", 3)
    upload(tmp_path / "ckpt", tmp_path / "out")
    assert _contents(tmp_path / "out" / "ckpt") == files


def test_upload_of_a_missing_artifact(tmp_path):
    with pytest.raises(StorageError, match="does not exist"):
        upload(tmp_path / "model.tar.gz", tmp_path / "out")
