"""RecordIO framing (hora.data.recordio): dmlc's layout byte for byte, multi-part records around the magic number,
and clear errors for damaged streams. tests/multiprocess/mxnet/test_recordio_mxnet.py checks it against MXNet's own
writer and reader in the MXNet environment."""

from __future__ import annotations

import io
import os
import struct

import pytest

from hora.data import PipeDataset, encode_recordio, iter_recordio
from hora.data.recordio import MAGIC
from hora.errors import RecordError

MAGIC_BYTES = struct.pack("<I", MAGIC)


def test_a_whole_record_is_magic_length_data_and_zero_padding():
    assert encode_recordio(b"abcde") == MAGIC_BYTES + struct.pack("<I", 5) + b"abcde" + b"\0\0\0"
    assert encode_recordio(b"") == MAGIC_BYTES + struct.pack("<I", 0)
    assert encode_recordio(b"abcd") == MAGIC_BYTES + struct.pack("<I", 4) + b"abcd"


def test_the_magic_at_an_aligned_offset_splits_the_record_and_is_left_out():
    data = b"abcd" + MAGIC_BYTES + b"efg"
    first, last = (1 << 29) | 4, (3 << 29) | 3
    assert encode_recordio(data) == (
        MAGIC_BYTES + struct.pack("<I", first) + b"abcd" + MAGIC_BYTES + struct.pack("<I", last) + b"efg\0"
    )
    assert list(iter_recordio(io.BytesIO(encode_recordio(data)))) == [data]
    unaligned = b"ab" + MAGIC_BYTES + b"cd"  # not at a multiple of 4: stays in one part
    assert encode_recordio(unaligned)[4:8] == struct.pack("<I", len(unaligned))


@pytest.mark.parametrize(
    "record",
    [b"", b"x", os.urandom(5001), MAGIC_BYTES, MAGIC_BYTES * 3, b"1234" + MAGIC_BYTES + MAGIC_BYTES + b"tail"],
    ids=["empty", "one byte", "5001 random", "only the magic", "three magics", "magic twice inside"],
)
def test_roundtrip(record):
    stream = io.BytesIO(encode_recordio(record) + encode_recordio(b"next"))
    assert list(iter_recordio(stream)) == [record, b"next"]


def test_pipe_dataset_reads_recordio_files(tmp_path):
    records = [b"first", os.urandom(300), b"a" * 4 + MAGIC_BYTES]
    (tmp_path / "f.rec").write_bytes(b"".join(encode_recordio(r) for r in records))
    ds = PipeDataset(tmp_path / "f.rec", record_format="recordio")
    assert list(ds) == records


def test_damage_names_the_offset():
    blob = encode_recordio(b"first!") + b"\x01\x02\x03\x04" + encode_recordio(b"x")[4:]
    with pytest.raises(RecordError, match=r"corrupt RecordIO in <stream> at offset 16: found 0x04030201"):
        list(iter_recordio(io.BytesIO(blob)))
    with pytest.raises(RecordError, match=r"truncated RecordIO .* at offset 0: the part says 6 data bytes"):
        list(iter_recordio(io.BytesIO(encode_recordio(b"first!")[:11])))
    with pytest.raises(RecordError, match="after 5 of the 8 header bytes"):
        list(iter_recordio(io.BytesIO(encode_recordio(b"ok") + MAGIC_BYTES + b"\0")))
    middle = MAGIC_BYTES + struct.pack("<I", (2 << 29) | 4) + b"abcd"
    with pytest.raises(RecordError, match="part flag 2 without a first part"):
        list(iter_recordio(io.BytesIO(middle)))
    first = MAGIC_BYTES + struct.pack("<I", (1 << 29) | 4) + b"abcd"
    with pytest.raises(RecordError, match="ends inside a multi-part record"):
        list(iter_recordio(io.BytesIO(first)))


def test_records_of_2_to_the_29_bytes_are_refused():
    with pytest.raises(RecordError, match="less than 2\\^29 bytes"):
        encode_recordio(bytes((1 << 29) - 1 + 1))
