"""Hostile inputs for the fuzz tests (tests/unit/runtime/test_fuzz.py, tests/multiprocess/jobs/test_hosts.py)."""

from __future__ import annotations

import random
import struct

from hora._runtime.auth import MAGIC, VERSION

#: The frame limit the fuzzed decoders and servers use.
LIMIT = 1 << 16


def frame_case(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 40))
    if kind == 1:  # a huge length, maybe followed by some bytes
        return struct.pack("!Q", rng.choice([LIMIT + 1, 1 << 31, 1 << 62, (1 << 64) - 1])) + rng.randbytes(rng.randrange(8))
    length = rng.randrange(0, 200)
    payload = rng.randbytes(length)
    if kind == 2:  # truncated payload
        return struct.pack("!Q", length) + payload[: rng.randrange(0, length + 1)]
    if kind == 3:  # truncated header
        return struct.pack("!Q", length)[: rng.randrange(0, 8)]
    return struct.pack("!Q", length) + payload


def handshake_case(rng: random.Random, secret: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 120))
    body = struct.pack("!4sBBi32s32s", MAGIC, VERSION, rng.randrange(256), rng.randrange(-2**31, 2**31),
                       rng.randbytes(32), rng.randbytes(32))
    if kind == 1:  # truncated
        return body[: rng.randrange(0, len(body))]
    if kind == 2:  # one byte flipped
        i = rng.randrange(len(body))
        return body[:i] + bytes([body[i] ^ (1 + rng.randrange(255))]) + body[i + 1 :]
    return body + rng.randbytes(rng.randrange(1, 64))  # forged proof, trailing junk
