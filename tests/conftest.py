"""Hygiene for every test: no leaked child processes, no leaked shared memory, no leaked hora state."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the harness and the worker functions, for the ranks too


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            data = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != b"Z":
            out.add(int(entry.name))
    return out


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("hora-")}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def hygiene():
    before_children = _children(os.getpid())
    before_segments = _segments()
    yield
    import hora

    if hora.is_initialized():
        hora.shutdown()
        pytest.fail("the test left hora initialized in the test process")
    deadline = time.monotonic() + 5
    while True:
        leaked = _children(os.getpid()) - before_children
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"the test left child processes behind: {sorted(leaked)}"
    # A named segment exists for milliseconds while ranks attach (another job on the machine may be attaching):
    # only one that stays is a leak.
    deadline = time.monotonic() + 2
    while (segs := _segments() - before_segments) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not segs, f"the test left shared-memory segments behind: {sorted(segs)}"


@pytest.fixture(scope="session")
def netns_cluster():
    """SSH "hosts" in network namespaces, a black-hole host and an unreachable address (see tests/netns.py).

    Skips with the reason when this machine cannot build them (not root, no ``ip netns``, no sshd).
    """
    import netns

    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    cluster = netns.start_cluster()
    try:
        yield cluster
    finally:
        cluster.close()
