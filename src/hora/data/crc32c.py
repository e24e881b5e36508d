"""CRC-32C (Castagnoli), the checksum of TFRecord framing, with TensorFlow's masking.

A C implementation is used when one is installed (``google-crc32c``, in the ``jobs`` extra, or ``crc32c``); the
pure-Python table below is the fallback so that reading TFRecords never needs a compiled dependency. The fallback is
correct but slow (roughly 10 MB/s), which matters only for large TFRecord streams with CRC checks on.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["IMPLEMENTATION", "crc32c", "crc32c_python", "masked_crc32c"]

_POLY = 0x82F63B78  # Castagnoli polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8


def _make_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _make_table()


def crc32c_python(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``crc`` (0 to start); pure Python."""
    table = _TABLE
    c = crc ^ 0xFFFFFFFF
    for b in bytes(data):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _load() -> tuple[Callable[[bytes | bytearray | memoryview], int], str]:
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            return (lambda data: int(google_crc32c.value(bytes(data)))), "google-crc32c"
    except ImportError:
        pass
    try:
        import crc32c as _crc32c_mod

        return (lambda data: int(_crc32c_mod.crc32c(bytes(data)))), "crc32c"
    except ImportError:
        pass
    return crc32c_python, "python"


crc32c: Callable[[bytes | bytearray | memoryview], int]
crc32c, IMPLEMENTATION = _load()


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TensorFlow's masked CRC-32C: rotate right by 15 bits and add a constant, so CRCs of CRCs stay strong."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF
