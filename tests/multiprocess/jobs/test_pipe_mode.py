"""Pipe mode end to end (FIFOs per epoch read by a separate process), TFRecord framing and CRC-32C."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hora.data import PipeDataset, encode_tfrecord, iter_tfrecords
from hora.data import crc32c as _crc32c
from hora.errors import ChannelError, ConfigError, RecordError, StorageError, TimeoutError
from hora.jobs.channels import stage_channel
from support import paths

SRC = str(paths.SRC)

# RFC 3720 (iSCSI), appendix B.4, and the usual check value of "123456789".
CRC32C_VECTORS = [
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"123456789", 0xE3069283),
    (b"", 0),
]


@pytest.mark.parametrize("data,expected", CRC32C_VECTORS)
def test_crc32c_published_vectors(data, expected):
    assert _crc32c.crc32c_python(data) == expected
    assert _crc32c.crc32c(data) == expected  # whichever implementation is installed


def test_crc32c_library_agrees_with_the_fallback():
    if _crc32c.IMPLEMENTATION == "python":
        pytest.skip("no C CRC-32C library installed (google-crc32c or crc32c): only the fallback exists")
    data = os.urandom(100_003)
    assert _crc32c.crc32c(data) == _crc32c.crc32c_python(data)


def test_tfrecord_framing_follows_the_spec():
    # TensorFlow's masking: rotate right by 15, add 0xa282ead8. CRC-32C of b"" is 0, so its mask is the constant.
    assert _crc32c.masked_crc32c(b"") == 0xA282EAD8
    c = 0x8A9136AA  # CRC-32C of 32 zero bytes (RFC 3720)
    assert _crc32c.masked_crc32c(bytes(32)) == (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    record = encode_tfrecord(bytes(32))
    assert len(record) == 8 + 4 + 32 + 4
    assert record[:8] == struct.pack("<Q", 32)
    assert struct.unpack("<I", record[8:12])[0] == _crc32c.masked_crc32c(struct.pack("<Q", 32))
    assert record[12:44] == bytes(32)
    assert struct.unpack("<I", record[44:])[0] == _crc32c.masked_crc32c(bytes(32))


def _tfrecord_file(path: Path, records: list[bytes]) -> list[int]:
    offsets, blob = [], b""
    for r in records:
        offsets.append(len(blob))
        blob += encode_tfrecord(r)
    path.write_bytes(blob)
    return offsets


def test_tfrecord_roundtrip_from_a_plain_file(tmp_path):
    records = [b"", b"x", os.urandom(5000), b"last"]
    _tfrecord_file(tmp_path / "f.tfrecord", records)
    ds = PipeDataset(tmp_path / "f.tfrecord", record_format="tfrecord")
    assert list(ds) == records
    assert list(ds) == records  # a plain file is read again on every iteration


@pytest.mark.parametrize("where", ["length", "length_crc", "data", "data_crc"])
def test_tfrecord_corruption_names_the_offset(tmp_path, where):
    path = tmp_path / "f.tfrecord"
    offsets = _tfrecord_file(path, [b"first record", b"second record", b"third"])
    blob = bytearray(path.read_bytes())
    start = offsets[1]
    index = {"length": start, "length_crc": start + 9, "data": start + 14, "data_crc": start + 12 + 13 + 1}[
        where
    ]
    blob[index] ^= 0x40
    path.write_bytes(bytes(blob))
    ds = PipeDataset(path, record_format="tfrecord")
    records = []
    with pytest.raises(RecordError, match=rf"offset {start}\b") as info:
        records.extend(ds)
    assert records == [b"first record"]
    assert str(path) in str(info.value)
    assert ("length" if where.startswith("length") else "data CRC") in str(info.value)
    # Unchecked, a damaged data byte goes through (the length is intact).
    if where == "data":
        assert len(list(PipeDataset(path, record_format="tfrecord", check_crc=False))) == 3


def test_truncated_tfrecord_is_an_error(tmp_path):
    path = tmp_path / "f.tfrecord"
    offsets = _tfrecord_file(path, [b"a" * 10, b"b" * 100])
    path.write_bytes(path.read_bytes()[:-20])
    with (
        open(path, "rb") as f,
        pytest.raises(RecordError, match=rf"truncated TFRecord .* at offset {offsets[1]}"),
    ):
        list(iter_tfrecords(f, source=str(path)))


def test_text_records_from_a_plain_file(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"one\ntwo\r\n\nlast-without-newline")
    assert list(PipeDataset(path)) == ["one", "two", "", "last-without-newline"]
    assert list(PipeDataset(path, encoding=None)) == [b"one", b"two", b"", b"last-without-newline"]


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="record_format 'csv'"):
        PipeDataset(tmp_path, record_format="csv")
    with pytest.raises(ConfigError, match="epoch"):
        PipeDataset(tmp_path, epoch=-1)


def test_a_fifo_that_never_appears_times_out(tmp_path):
    ds = PipeDataset(tmp_path / "data" / "train", timeout=0.3)
    with pytest.raises(TimeoutError, match="train_0 did not appear"):
        list(ds)


def test_channel_names_resolve_from_the_sm_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("SM_CHANNEL_TRAIN", str(tmp_path / "a" / "data" / "train"))
    monkeypatch.setenv("SM_INPUT_DIR", str(tmp_path / "b"))
    assert PipeDataset("train").fifo_path(3) == tmp_path / "a" / "data" / "train_3"
    assert PipeDataset("eval", epoch=2).fifo_path(2) == tmp_path / "b" / "data" / "eval_2"


# -- through real FIFOs, read by another process --------------------------------------------------------------

READER = textwrap.dedent(
    """
    import json, sys
    from hora.data import PipeDataset
    channel, fmt, epochs, limits = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    ds = PipeDataset(channel, record_format=fmt, timeout=120)
    out = []
    for epoch in range(epochs):
        records = []
        for record in ds:
            records.append(record if isinstance(record, str) else record.hex())
            if limits[epoch] is not None and len(records) >= limits[epoch]:
                break  # closes this epoch's FIFO early
        out.append(records)
    print(json.dumps(out))
    """
)


def _read_in_another_process(channel: Path, fmt: str, epochs: int, limits=None) -> list[list[str]]:
    limits = limits or [None] * epochs
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.run(
        [sys.executable, "-c", READER, str(channel), fmt, str(epochs), json.dumps(limits)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _stage_pipe(src: Path, data: Path, name: str = "train"):
    return stage_channel(
        name, src, data / name, input_mode="Pipe", distribution="FullyReplicated", host_index=0, host_count=1
    )


def test_text_pipe_several_epochs(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a1\na2\n")
    (src / "sub" / "b.txt").write_text("b1\nb2\n")
    data = tmp_path / "data"
    handle = _stage_pipe(src, data)
    try:
        assert os.listdir(data) == ["train_0"]  # the first FIFO exists before the script starts
        assert handle.fifo_path(0) == data / "train_0"
        epochs = _read_in_another_process(data / "train", "text", 3)
        assert epochs == [["a1", "a2", "b1", "b2"]] * 3
    finally:
        handle.close()
    assert handle.error is None
    assert handle.epochs_completed >= 3
    assert os.listdir(data) == []  # FIFOs removed


def test_tfrecord_pipe_several_epochs_with_a_reader_that_closes_early(tmp_path):
    # More bytes than a pipe buffer holds, so the feeder is blocked in a write when the reader goes away.
    records = [os.urandom(1000 + i) for i in range(300)]
    src = tmp_path / "src"
    src.mkdir()
    _tfrecord_file(src / "part-0.tfrecord", records[:150])
    _tfrecord_file(src / "part-1.tfrecord", records[150:])
    data = tmp_path / "data"
    handle = _stage_pipe(src, data)
    try:
        epochs = _read_in_another_process(data / "train", "tfrecord", 3, limits=[None, 5, None])
    finally:
        handle.close()
    assert handle.error is None
    hexes = [r.hex() for r in records]
    assert epochs == [hexes, hexes[:5], hexes]


def test_close_returns_with_no_reader_at_all(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("x\n")
    data = tmp_path / "data"
    handle = _stage_pipe(src, data)
    handle.close(timeout=30)
    assert not handle._feeder._thread.is_alive()
    assert not (data / "train_0").exists()


def test_close_returns_while_a_reader_holds_the_fifo_without_reading(tmp_path):
    src = tmp_path / "f.txt"
    src.write_bytes(b"line\n" * 2_000_000)  # 10 MB: the feeder fills the pipe and waits for room
    data = tmp_path / "data"
    handle = _stage_pipe(src, data)
    code = (
        "import sys\n"
        "from hora.data import PipeDataset\n"
        "from hora.errors import ChannelError\n"
        "it = iter(PipeDataset(sys.argv[1], timeout=60))\n"
        "print(next(it), flush=True)\n"
        "sys.stdin.readline()\n"  # hold the FIFO open, reading nothing more, until the test says go on
        "n = 1\n"
        "try:\n"
        "    for _ in it:\n"
        "        n += 1\n"
        "    print('complete', n)\n"
        "except ChannelError as exc:\n"
        "    print('cut', n, exc)\n"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", code, str(data / "train")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "line"
        handle.close(timeout=30)
        assert not handle._feeder._thread.is_alive()
        assert not (data / "train_0").exists()
        # What the pipe held still arrives; then the reader learns that the stream was cut, not complete.
        out, _ = reader.communicate("go on\n", timeout=60)
        status, count, message = out.split(" ", 2)
        assert status == "cut", out
        assert 1 <= int(count) < 2_000_000
        assert "channel 'train': the job runner stopped streaming" in message
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
        handle.close()


def test_a_source_failing_mid_stream_reaches_the_reader(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    (src / "b.txt").write_text("b\n")
    data = tmp_path / "data"
    handle = _stage_pipe(src, data)
    try:
        ds = PipeDataset(data / "train", timeout=60)
        assert list(ds) == ["a", "b"]
        (src / "b.txt").unlink()
        got = []
        with pytest.raises(ChannelError, match=r"channel 'train'.*b\.txt"):
            got.extend(ds)
        assert got == ["a"]
        assert isinstance(handle.error, StorageError)
    finally:
        handle.close()


def test_public_names_of_hora_data():
    import hora.data

    assert set(hora.data.__all__) == {
        "RECORD_FORMATS", "PipeDataset", "encode_recordio", "encode_tfrecord", "iter_recordio", "iter_tfrecords"
    }
    assert all(hasattr(hora.data, name) for name in hora.data.__all__)
