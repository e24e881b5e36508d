"""Shared memory between a worker and a server on the same host: the payloads skip the socket.

The client creates a segment of its own in /dev/shm (a random name, mode 0600, created exclusively), announces it
on its authenticated connection (``{"op": "shm", "name", "size"}``), and unlinks it as soon as the server has mapped
it, so no crash can leave it behind. From then on a request with ``"shm": n`` in its header has its n payload bytes
at the start of the segment instead of in a payload frame, and a reply with ``"shm": n`` has its payload there too;
the request/reply order on the socket is the only synchronisation needed (one request at a time per connection).
The server checks the segment's owner and size, and every announced length against the size, before using it.
"""

from __future__ import annotations

import mmap
import os
import secrets

import numpy as np

from hora.errors import ProtocolError

__all__ = ["PREFIX", "ShmBuffer"]

PREFIX = "hora-ps-"
_DIR = "/dev/shm"


class ShmBuffer:
    """A mapped segment; ``u8`` is a uint8 view of all of it."""

    def __init__(self, mm: mmap.mmap, name: str, size: int) -> None:
        self._mm: mmap.mmap | None = mm
        self.name, self.size = name, size
        self.u8 = np.frombuffer(mm, np.uint8)

    @classmethod
    def create(cls, size: int) -> ShmBuffer:
        name = PREFIX + secrets.token_hex(16)
        path = os.path.join(_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # a full /dev/shm fails here (ENOSPC), not later with SIGBUS
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(mm, name, size)

    @classmethod
    def attach(cls, name: str, size: int) -> ShmBuffer:
        """Map a worker's segment; refuse names outside hora's, other owners and sizes that differ."""
        if not name.startswith(PREFIX) or os.path.basename(name) != name or not 0 < size <= 1 << 40:
            raise ProtocolError(f"refusing shared-memory segment {name!r} of {size} bytes")
        fd = os.open(os.path.join(_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_size != size or st.st_mode & 0o077:
                raise ProtocolError(f"shared-memory segment {name} is not this user's private segment of {size} bytes")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(mm, name, size)

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(_DIR, self.name))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._mm is not None:
            self.u8 = np.empty(0, np.uint8)
            try:
                self._mm.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes when it does
                pass
            self._mm = None
