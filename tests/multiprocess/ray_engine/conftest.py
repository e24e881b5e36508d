"""One local Ray instance (``ray.init``) for the Ray tests of this directory, in a private temp dir."""

from __future__ import annotations

import shutil

import pytest

from support.ray_cluster import local_cluster, processes_under, ray_environment, settle


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    tmp = ray_environment(mp)
    try:
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=100 << 20, _temp_dir=tmp)
        yield ray
    finally:
        ray.shutdown()
        mp.undo()
        left = settle(lambda: processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        assert left == [], f"Ray processes outlived ray.shutdown(): {left}"


@pytest.fixture(scope="module")
def two_nodes():
    """A 2-node Ray cluster on this machine (a head and a second raylet, 2 CPUs each: Ray's cluster_utils)."""
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    try:
        with local_cluster(mp, nodes=2, num_cpus=2) as cluster:
            ray.init(address=cluster.address)
            try:
                yield cluster
            finally:
                ray.shutdown()
    finally:
        mp.undo()
