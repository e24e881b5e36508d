"""TFRecord framing, as ``tf.io.TFRecordWriter`` writes it: ``uint64`` length (little-endian), masked CRC-32C of the
length, the data, masked CRC-32C of the data. Used by Pipe-mode channels (:mod:`hora.data.pipe_mode`) and by
``hora job``'s feeders; no TensorFlow needed."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

from hora._wire import read_fully
from hora.data.crc32c import masked_crc32c
from hora.errors import RecordError

__all__ = ["encode_tfrecord", "iter_tfrecords"]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def encode_tfrecord(data: bytes) -> bytes:
    """One record in TFRecord framing (what ``tf.io.TFRecordWriter`` writes for ``data``, uncompressed)."""
    length = struct.pack("<Q", len(data))
    return length + _FOOTER.pack(masked_crc32c(length)) + data + _FOOTER.pack(masked_crc32c(data))


def iter_tfrecords(stream: BinaryIO, *, source: str = "<stream>", check_crc: bool = True) -> Iterator[bytes]:
    """Yields the records of a TFRecord byte stream, checking both CRCs of each unless ``check_crc`` is false.

    Raises:
        RecordError: a CRC does not match or the stream ends inside a record; the message names ``source`` and
            the byte offset where the record starts.
    """
    offset = 0
    while True:
        header = read_fully(stream.read, _HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise RecordError(
                f"truncated TFRecord in {source} at offset {offset}: the stream ends after {len(header)} of the "
                f"{_HEADER.size} header bytes"
            )
        length, length_crc = _HEADER.unpack(header)
        if check_crc and masked_crc32c(header[:8]) != length_crc:
            raise RecordError(
                f"corrupt TFRecord in {source} at offset {offset}: the length field's CRC does not match "
                f"(stored {length_crc:#010x}, computed {masked_crc32c(header[:8]):#010x}); the data is damaged or "
                "is not TFRecord (use record_format='text' for text)"
            )
        body = read_fully(stream.read, length + _FOOTER.size)
        if len(body) < length + _FOOTER.size:
            raise RecordError(
                f"truncated TFRecord in {source} at offset {offset}: the record says {length} data bytes but the "
                f"stream ends after {len(body)} of its {length + _FOOTER.size} data and CRC bytes"
            )
        data = body[:length]
        (data_crc,) = _FOOTER.unpack(body[length:])
        if check_crc and masked_crc32c(data) != data_crc:
            raise RecordError(
                f"corrupt TFRecord in {source} at offset {offset}: the data CRC of the {length}-byte record does "
                f"not match (stored {data_crc:#010x}, computed {masked_crc32c(data):#010x})"
            )
        yield data
        offset += _HEADER.size + length + _FOOTER.size
