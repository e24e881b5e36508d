"""RecordIO framing, as MXNet's ``dmlc::RecordIOWriter`` writes it and SageMaker's ``application/x-recordio`` and
``application/x-recordio-protobuf`` content (and ``PipeModeDataset(record_format="RecordIO")``) uses it.

Every part is ``uint32`` magic ``0xced7230a`` and ``uint32`` ``lrecord`` (little-endian; the upper 3 bits are the
continuation flag, the lower 29 the part's length), then the data, padded with zeros to a multiple of 4 bytes. A
record whose data contains the magic at a 4-byte-aligned offset is split there into parts (flags 1 = first, 2 =
middle, 3 = last; 0 = a whole record) and the magic itself is left out, so the reader puts it back between the
parts. No MXNet or TensorFlow needed."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

from hora._wire import read_fully
from hora.errors import RecordError

__all__ = ["MAGIC", "encode_recordio", "iter_recordio"]

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_HEADER = struct.Struct("<II")
_LENGTH_BITS = 29
_MAX_LENGTH = (1 << _LENGTH_BITS) - 1


def _header(flag: int, length: int) -> bytes:
    return _HEADER.pack(MAGIC, (flag << _LENGTH_BITS) | length)


def encode_recordio(data: bytes) -> bytes:
    """One record in RecordIO framing, byte for byte what ``dmlc::RecordIOWriter::WriteRecord`` writes."""
    if len(data) > _MAX_LENGTH:
        raise RecordError(f"a RecordIO record holds less than 2^29 bytes, not {len(data)}")
    out, start = bytearray(), 0
    for i in range(0, len(data) - len(data) % 4, 4):
        if data[i : i + 4] == _MAGIC_BYTES:  # split here; the reader puts the magic back
            out += _header(1 if start == 0 else 2, i - start) + data[start:i]
            start = i + 4
    out += _header(3 if start else 0, len(data) - start) + data[start:]
    out += b"\0" * (-len(data) % 4)
    return bytes(out)


def iter_recordio(stream: BinaryIO, *, source: str = "<stream>") -> Iterator[bytes]:
    """Yields the records of a RecordIO byte stream (multi-part records joined as dmlc's reader joins them).

    Raises:
        RecordError: a part does not start with the magic number, its flags are out of order, or the stream ends
            inside a record; the message names ``source`` and the byte offset of the part.
    """
    offset = 0
    parts: list[bytes] = []
    while True:
        header = read_fully(stream.read, _HEADER.size)
        if not header:
            if parts:
                raise RecordError(
                    f"truncated RecordIO in {source}: the stream ends inside a multi-part record (no last part)"
                )
            return
        if len(header) < _HEADER.size:
            raise RecordError(
                f"truncated RecordIO in {source} at offset {offset}: the stream ends after {len(header)} of the "
                f"{_HEADER.size} header bytes"
            )
        magic, lrecord = _HEADER.unpack(header)
        if magic != MAGIC:
            raise RecordError(
                f"corrupt RecordIO in {source} at offset {offset}: found {magic:#010x} where the magic number "
                f"{MAGIC:#010x} starts a record; the data is damaged or is not RecordIO (record_format='TFRecord' or "
                "'TextLine' for those)"
            )
        flag, length = lrecord >> _LENGTH_BITS, lrecord & _MAX_LENGTH
        if flag > 3 or (flag in (2, 3)) != bool(parts):
            raise RecordError(
                f"corrupt RecordIO in {source} at offset {offset}: part flag {flag} "
                + ("after a first part (expected 2 or 3)" if parts else "without a first part (expected 0 or 1)")
            )
        padded = length + (-length % 4)
        body = read_fully(stream.read, padded)
        if len(body) < padded:
            raise RecordError(
                f"truncated RecordIO in {source} at offset {offset}: the part says {length} data bytes but the "
                f"stream ends after {len(body)} of its {padded} padded bytes"
            )
        offset += _HEADER.size + padded
        if flag == 0:
            yield body[:length]
            continue
        parts.append(body[:length])
        if flag == 3:
            record, parts = _MAGIC_BYTES.join(parts), []
            yield record
