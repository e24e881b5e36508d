"""A job on a Ray cluster in the spec (``cluster: {ray: ADDRESS}``) and on the command line (``--ray``): parsed, kept,
refused beside SSH settings; and what each host asks of its node (hora.jobs.ray_hosts.bundle_of)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hora.errors import ConfigError, SpecError
from hora.jobs import parse_spec
from hora.jobs.ray_hosts import bundle_of, host_name
from hora.jobs.remote_spec import DEFAULT_WORK_DIR, ClusterSpec, cli_cluster
from hora.jobs.spec import spec_from_dict


def _spec(tmp_path: Path, cluster: object, **extra: object):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return parse_spec({"entry_point": "train.py", "job_name": "j", "cluster": cluster, **extra}, base_dir=tmp_path)


def test_a_ray_cluster_is_parsed_kept_and_rebuilt(tmp_path):
    spec = _spec(tmp_path, {"ray": "10.0.0.1:6379", "work_dir": "/scratch/{host}", "python": "/opt/py/bin/python"},
                 instance_count=3)
    assert spec.cluster == ClusterSpec((), work_dir="/scratch/{host}", python="/opt/py/bin/python", backend="ray",
                                       address="10.0.0.1:6379")
    assert spec_from_dict(spec.to_dict()) == spec  # the detached supervisor's copy
    ssh = _spec(tmp_path, {"hosts": ["a"]}).cluster
    assert ssh is not None and ssh.backend == "ssh" and ssh.address is None


@pytest.mark.parametrize(
    ("cluster", "problem"),
    [
        ({"ray": "auto", "hosts": ["a"]}, "cluster.ray cannot go with cluster.hosts: on a Ray cluster the hosts are"),
        ({"ray": "auto", "ssh_port": 22, "ssh_options": ["A=b"]},
         "cannot go with cluster.ssh_port, cluster.ssh_options"),
        ({"ray": "auto", "slurm": True}, "give slurm: true (the nodes of a Slurm allocation) or ray (a Ray cluster)"),
        ({"ray": "auto", "hostfile": "h.txt"}, "cluster.ray cannot go with cluster.hostfile"),
        ({"ray": ""}, "cluster.ray must be the Ray cluster's address (auto, HOST:PORT or ray://HOST:PORT), got ''"),
        ({"ray": 6379}, "cluster.ray must be the Ray cluster's address"),
        ({"rya": "auto"}, "did you mean 'ray'"),
    ],
)
def test_a_wrong_ray_cluster_is_named_with_the_fix(tmp_path, cluster, problem):
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, cluster)
    assert problem in str(err.value)


def test_ray_on_the_command_line(tmp_path):
    spec = _spec(tmp_path, {"work_dir": "/w"}, instance_count=2)
    cluster = cli_cluster(spec.cluster, None, None, 2, "auto")
    assert (cluster.backend, cluster.address, cluster.work_dir, cluster.hosts) == ("ray", "auto", "/w", ())
    assert cli_cluster(None, None, None, 2, "h:1").work_dir == DEFAULT_WORK_DIR
    with pytest.raises(ConfigError, match=r"give --hosts/--hostfile \(SSH hosts\) or --ray"):
        cli_cluster(None, "a,b", None, 2, "auto")
    with pytest.raises(ConfigError, match="the spec's cluster: names SSH hosts or settings"):
        cli_cluster(_spec(tmp_path, {"hosts": ["a", "b"]}, instance_count=2).cluster, None, None, 2, "auto")
    with pytest.raises(ConfigError, match=r"names a Ray cluster \(cluster.ray\); remove it to run over SSH"):
        cli_cluster(_spec(tmp_path, {"ray": "auto"}).cluster, "a", None, 1)


@pytest.mark.parametrize(
    ("fields", "bundle"),
    [
        ({"processes_per_host": 2}, {"CPU": 2.0}),
        ({"processes_per_host": 4, "instance_type": "ml.p3.8xlarge"}, {"CPU": 4.0, "GPU": 4.0}),
        ({"processes_per_host": 1, "instance_type": "ml.g5.xlarge"}, {"CPU": 1.0, "GPU": 1.0}),
        ({"processes_per_host": 2, "instance_type": "local_gpu"}, {"CPU": 2.0, "GPU": 2.0}),
        ({"processes_per_host": 2, "instance_type": "ml.c5.xlarge"}, {"CPU": 2.0}),
        ({"distribution": "parameter_server", "instance_count": 2}, {"CPU": 2.0}),  # its server beside the worker
    ],
)
def test_what_each_host_asks_of_its_node(tmp_path, fields, bundle):
    assert bundle_of(_spec(tmp_path, {"ray": "auto"}, **fields)) == bundle


def test_hosts_are_named_by_their_node():
    assert host_name("9ce2328b03b805f95227c509698c08651be8f4db18384c0bb8018402") == "ray-9ce2328b03b8"
