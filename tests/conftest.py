"""Hygiene for every test: no leaked child processes, shared memory, threads, environment changes or hora state.

``tests/`` is on ``sys.path`` (here and, through ``hora.runner.run``, in every rank), so tests and ranks import
the helpers as ``support.*`` and the ranks' functions as ``workers.*``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.procs import child_states
from support.slow_tier import listed

_SLOW = set(listed())


def pytest_collection_modifyitems(config, items):
    """Mark the tests of tests/slow_tests.txt ``slow`` (.ci/run runs them in a second pass)."""
    for item in items:
        if item.nodeid in _SLOW:
            item.add_marker(pytest.mark.slow)


def _children(pid: int) -> set[int]:
    return {child for child, state in child_states(pid).items() if state != b"Z"}


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("hora-")}
    except FileNotFoundError:
        return set()


#: Variables that libraries set for themselves the first time they need them, not a test's doing: pytest's own,
#: and torch's compile cache (set on the first optimizer step in this process).
_LIBRARY_VARIABLES = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


def _environment() -> dict[str, str]:
    """This process's environment, without what libraries change on their own."""
    return {k: v for k, v in os.environ.items() if k not in _LIBRARY_VARIABLES}


def _settle(check, seconds: float):
    """``check()`` until it returns something empty or ``seconds`` pass; its last result."""
    deadline = time.monotonic() + seconds
    while (left := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(autouse=True)
def hygiene():
    before_children = _children(os.getpid())
    before_segments = _segments()
    before_threads = set(threading.enumerate())
    before_env = _environment()
    yield
    import hora

    if hora.is_initialized():
        hora.shutdown()
        pytest.fail("the test left hora initialized in the test process")
    leaked = _settle(lambda: _children(os.getpid()) - before_children, 5.0)
    assert not leaked, f"the test left child processes behind: {sorted(leaked)}"
    # A named segment exists for milliseconds while ranks attach (another job on the machine may be attaching):
    # only one that stays is a leak.
    segs = _settle(lambda: _segments() - before_segments, 2.0)
    assert not segs, f"the test left shared-memory segments behind: {sorted(segs)}"
    threads = _settle(lambda: {t for t in threading.enumerate() if t.is_alive()} - before_threads, 5.0)
    assert not threads, f"the test left threads running: {sorted(t.name for t in threads)}"
    after_env = _environment()
    if after_env != before_env:
        changed = sorted(k for k in set(before_env) | set(after_env) if before_env.get(k) != after_env.get(k))
        for k in changed:
            if k in before_env:
                os.environ[k] = before_env[k]
            else:
                os.environ.pop(k, None)
        pytest.fail(f"the test changed the environment (use monkeypatch): {changed}")


@pytest.fixture(scope="session")
def netns_cluster():
    """SSH "hosts" in network namespaces, a black-hole host and an unreachable address (see support/netns_hosts.py).

    Skips with the reason when this machine cannot build them (not root, no ``ip netns``, no sshd).
    """
    from support import netns_hosts

    reason = netns_hosts.unavailable()
    if reason:
        pytest.skip(reason)
    cluster = netns_hosts.start_cluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def netns_cluster3():
    """As :func:`netns_cluster` with three SSH hosts, for the tests a third host makes stronger (a host lost in the
    middle of the list, the hosts on both sides of it cleaned up); built for the module that asks for it only."""
    from support import netns_hosts

    reason = netns_hosts.unavailable()
    if reason:
        pytest.skip(reason)
    cluster = netns_hosts.start_cluster(3)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def slurm():
    """A real one-node Slurm cluster (slurmctld + slurmd, see support/slurm_cluster.py): the environment that points
    srun/salloc/sbatch/squeue at it. Skips with the reason when this machine cannot run one (not root, no slurm-wlm).
    """
    from support import slurm_cluster

    reason = slurm_cluster.unavailable()
    if reason:
        pytest.skip(reason)
    try:
        cluster = slurm_cluster.start_cluster()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield cluster.env
    finally:
        cluster.close()
