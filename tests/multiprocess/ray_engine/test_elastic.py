"""hora.ray.ElasticRayExecutor on a 2-node Ray cluster on this machine (Ray's ``cluster_utils.Cluster``, 2 CPUs a
node): the workers are actors; one SIGKILLed on the second node takes that node out and the others go on; what rank
0 logs reaches the driver's callbacks."""

from __future__ import annotations

import functools

import pytest

ray = pytest.importorskip("ray")

from hora.ray import ElasticRayExecutor, RayHostDiscovery  # noqa: E402
from workers import elastic_fns  # noqa: E402


def test_a_worker_killed_on_one_node_leaves_the_others_to_finish(two_nodes, tmp_path):
    hosts = sorted(RayHostDiscovery().find_available_hosts_and_slots())
    assert len(hosts) == 2  # two Ray nodes on one machine: two hora hosts
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, elastic_timeout=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    logged: list[tuple[int, int]] = []  # rank 0's (step, size) through Horovod's ray_logger, as its log file has
    fn = functools.partial(elastic_fns.train, str(tmp_path), hosts[1], 3, log_to_driver=True)
    results = executor.run(fn, callbacks=[logged.append])
    steps = [tuple(map(int, line.split())) for line in (tmp_path / "log").read_text().splitlines()]
    assert steps[0] == (0, 4) and steps[-1] == (11, 2)  # 4 workers, then the 2 of the first node
    assert logged == steps
    assert [r[:2] for r in results] == [(0, 2), (1, 2)] and len({r[2] for r in results}) == 1
    assert (tmp_path / "killed").read_text().startswith(hosts[1])
