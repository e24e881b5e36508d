"""hora's RecordIO framing against MXNet's own (dmlc-core's RecordIOWriter/Reader behind mx.recordio): the same
bytes for the same records, and each reads what the other wrote. Runs in .venv-mxnet (see test_mxnet.py)."""

from __future__ import annotations

import os
import struct

import pytest

mx = pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 needs numpy<1.24: these tests run in .venv-mxnet, the second pass of .ci/run"
)

from hora.data import encode_recordio, iter_recordio  # noqa: E402

MAGIC_BYTES = struct.pack("<I", 0xCED7230A)
RECORDS = [b"", b"x", os.urandom(5001), MAGIC_BYTES * 3, b"1234" + MAGIC_BYTES + b"tail", b"ab" + MAGIC_BYTES]


def test_hora_writes_what_mxnet_writes_and_reads_it_back(tmp_path):
    path = str(tmp_path / "mx.rec")
    writer = mx.recordio.MXRecordIO(path, "w")
    for r in RECORDS:
        writer.write(r)
    writer.close()
    with open(path, "rb") as f:
        blob = f.read()
    assert blob == b"".join(encode_recordio(r) for r in RECORDS)
    with open(path, "rb") as f:
        assert list(iter_recordio(f)) == RECORDS


def test_mxnet_reads_what_hora_writes(tmp_path):
    path = tmp_path / "hora.rec"
    path.write_bytes(b"".join(encode_recordio(r) for r in RECORDS))
    reader = mx.recordio.MXRecordIO(str(path), "r")
    got = []
    while (item := reader.read()) is not None:
        got.append(item)
    reader.close()
    assert got == RECORDS
