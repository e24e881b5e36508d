"""The wire format between ``hora run`` and its agent on a remote host (:mod:`hora.runner.host_agent`).

Launcher -> agent, on the SSH session's stdin: a 4-byte length and a JSON object (first the job description, which
holds the secret; then signal and stacks requests). Agent -> launcher, on its stdout: binary frames, a header (kind,
rank, stream, length) and a payload. Both ends run under the same user over an SSH channel; the launcher parses only
JSON.
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
from typing import IO, Any

from hora._wire import read_fd

__all__ = ["HEADER", "MAX_JOB_BYTES", "interface_address", "read_message", "write_message"]

#: Frame header of agent -> launcher messages: kind, rank, stream (1 stdout, 2 stderr), payload length.
HEADER = struct.Struct("!BiBI")
HELLO, STARTED, OUTPUT, CLOSED, EXITED, ERROR = 1, 2, 3, 4, 5, 6
#: A rank's Python stacks (all threads), the answer to a launcher's ``{"stacks": [ranks]}`` request.
STACKS = 7
#: A batch of the host's system metric samples, JSON ``[[time, name, value], ...]`` (``--system-metrics``).
SYSTEM = 8
#: Launcher -> agent messages are a 4-byte length and a JSON object; the job description is the largest.
MAX_JOB_BYTES = 64 << 20
_LEN = struct.Struct("!I")


def write_message(f: IO[bytes], message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    f.write(_LEN.pack(len(data)) + data)
    f.flush()


def read_message(fd: int, limit: int = MAX_JOB_BYTES) -> dict[str, Any]:
    """Read one launcher -> agent message; EOFError when the launcher closed the stream."""
    (length,) = _LEN.unpack(_read_all(fd, _LEN.size))
    if length > limit:
        raise ValueError(f"a message of {length} bytes is more than the {limit} allowed")
    message = json.loads(_read_all(fd, length))
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def _read_all(fd: int, n: int) -> bytes:
    data = read_fd(fd, n)
    if len(data) < n:
        raise EOFError
    return data


def interface_address(name: str) -> str:
    """The IPv4 address of the network interface ``name`` on this host (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            raise OSError(
                f"network interface {name!r} does not exist or has no IPv4 address: {exc.strerror}"
            ) from None
    return socket.inet_ntoa(packed[20:24])
