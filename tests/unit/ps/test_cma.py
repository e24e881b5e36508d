"""hora.ps.cma against a real second process: a server may read and write a worker's memory only while the pid it
was given holds the worker's segment token; bad addresses fail cleanly."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hora.errors import ProtocolError
from hora.ps import cma
from hora.ps.segment import Segment

pytestmark = pytest.mark.skipif(not cma.available(), reason="process_vm_readv is not available here")


@pytest.fixture
def segment():
    shm = Segment.create(1 << 16)
    yield shm
    shm.unlink()
    shm.close()


def test_the_owner_is_granted_and_reads_and_writes_land_in_its_arrays(segment):
    at = cma.new_token(segment.u8)
    remote = cma.RemoteMemory.verify(os.getpid(), at, segment.u8)
    assert remote is not None
    src = np.arange(1000, dtype=np.float32)
    got = np.empty_like(src)
    remote.read(src.ctypes.data, got)
    np.testing.assert_array_equal(got, src)
    dst = np.zeros(1000, np.float32)
    remote.write(dst.ctypes.data, got * 2)
    np.testing.assert_array_equal(dst, src * 2)
    remote.check()
    cma.new_token(segment.u8)  # the token changed (as it would in a new process): every request is refused
    with pytest.raises(ProtocolError, match="no longer holds"):
        remote.check()


def test_another_pid_a_wrong_address_or_a_bad_pointer_get_nothing(segment):
    at = cma.new_token(segment.u8)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert cma.RemoteMemory.verify(other.pid, at, segment.u8) is None  # not the segment's owner
    finally:
        other.kill()
        other.wait()
    assert cma.RemoteMemory.verify(other.pid, at, segment.u8) is None  # gone
    assert cma.RemoteMemory.verify(os.getpid(), at + 64, segment.u8) is None  # not where the token is
    remote = cma.RemoteMemory.verify(os.getpid(), at, segment.u8)
    assert remote is not None
    with pytest.raises(ProtocolError, match="Bad address"):
        remote.read(8, np.empty(16, np.uint8))  # an unmapped address fails the call, nothing is read
