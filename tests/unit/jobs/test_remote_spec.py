"""The spec's ``cluster:`` section, ``--hosts``/``--hostfile``, the per-host work directory and what a push ships
(hora.jobs.remote_spec), and each rank's wrapper finding its job directory on its host (_entry.job_dir_of)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hora.errors import ConfigError, SpecError
from hora.jobs import parse_spec
from hora.jobs._entry import job_dir_of
from hora.jobs.remote_spec import (
    DEFAULT_WORK_DIR,
    ClusterSpec,
    changes,
    cli_cluster,
    cluster_from_dict,
    hostfile_hosts,
    job_work_dir,
    manifest,
    parse_host_list,
)
from hora.jobs.spec import spec_from_dict


def _spec(tmp_path: Path, cluster: object, **extra: object):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return parse_spec({"entry_point": "train.py", "job_name": "j", "cluster": cluster, **extra}, base_dir=tmp_path)


def test_a_cluster_section_is_parsed_kept_and_rebuilt(tmp_path):
    spec = _spec(tmp_path, {"hosts": ["h1", "user@h2"], "ssh_port": 2222, "ssh_identity_file": "keys/id",
                            "ssh_options": ["StrictHostKeyChecking=yes"], "work_dir": "/scratch/{host}",
                            "python": "/opt/py/bin/python"}, instance_count=2)  # fmt: skip
    assert spec.cluster == ClusterSpec(("h1", "user@h2"), 2222, str(tmp_path / "keys" / "id"),
                                       ("StrictHostKeyChecking=yes",), "/scratch/{host}", "/opt/py/bin/python")
    assert spec_from_dict(spec.to_dict()) == spec  # the store's copy (the detached supervisor) comes back whole
    assert parse_spec({"entry_point": "train.py", "job_name": "j"}, base_dir=tmp_path).cluster is None
    assert cluster_from_dict(None) is None


def test_a_cluster_without_hosts_waits_for_the_command_line(tmp_path):
    spec = _spec(tmp_path, {"ssh_port": 22})
    assert spec.cluster is not None and spec.cluster.hosts == () and spec.cluster.work_dir == DEFAULT_WORK_DIR
    with_hosts = cli_cluster(spec.cluster, "a,b", None, 2)
    assert with_hosts.hosts == ("a", "b") and with_hosts.ssh_port == 22


@pytest.mark.parametrize(
    ("cluster", "extra", "problem"),
    [
        ({"hosts": ["a", "b"]}, {}, "cluster lists 2 host(s) but instance_count is 1"),
        ({"hosts": ["a", "a"]}, {"instance_count": 2}, "names host 'a' twice"),
        ({"hosts": ["a;rm -rf /"]}, {}, "is not a host name"),
        ({"hosts": ["a"], "hostfile": "f"}, {}, "give hosts or hostfile, not both"),
        ({"hosts": "a"}, {}, "cluster.hosts must be a non-empty list"),
        ({"hosts": ["a"], "ssh_port": 0}, {}, "cluster.ssh_port must be a port number"),
        ({"hosts": ["a"], "ssh_options": ["-v"]}, {}, "cluster.ssh_options must be a list of ssh -o options"),
        ({"hosts": ["a"], "work_dir": "rel/dir"}, {}, "must be absolute or start with ~/"),
        ({"hosts": ["a"], "python": "python3"}, {}, "cluster.python 'python3' must be an absolute path"),
        ({"hosts": ["a"], "host": "x"}, {}, "unknown field 'host' in cluster; did you mean 'hosts'?"),
        (["a"], {}, "cluster must be a mapping"),
    ],
)
def test_a_wrong_cluster_section_is_named_with_the_fix(tmp_path, cluster, extra, problem):
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, cluster, **extra)
    assert problem in str(err.value)


def test_hosts_on_the_command_line(tmp_path):
    assert parse_host_list(" a, b ,c") == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="--hosts is empty"):
        parse_host_list(",")
    with pytest.raises(ConfigError, match=r"3 host\(s\) given but the spec's instance_count is 2: .*instance_count: 3"):
        cli_cluster(None, "a,b,c", None, 2)
    with pytest.raises(ConfigError, match="not both"):
        cli_cluster(None, "a", "f", 1)


def test_a_hostfile_lists_the_hosts_in_order(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the cluster\nnode1 slots=4\n\nnode2:2  # second\nnode3\n")
    assert hostfile_hosts(str(f)) == ["node1", "node2", "node3"]
    assert cli_cluster(None, None, str(f), 3).hosts == ("node1", "node2", "node3")
    f.write_text("node1\nnode1\n")
    with pytest.raises(ConfigError, match="listed twice"):
        hostfile_hosts(str(f))
    with pytest.raises(ConfigError, match="cannot read the hostfile"):
        hostfile_hosts(str(tmp_path / "missing"))


def test_the_job_directory_on_each_host():
    assert job_work_dir("~/.hora/remote/", "j1", "h1") == "~/.hora/remote/j1"
    assert job_work_dir("/scratch/{host}", "j1", "10.0.0.2") == "/scratch/10.0.0.2/j1"
    argv = ["--remote", "~/w/{host}/j1", "2", "h1", "h2"]  # ranks 0, 1 on h1; 2, 3 on h2
    assert job_dir_of(argv, 1) == Path(os.path.expanduser("~/w/h1/j1"))
    assert job_dir_of(argv, 2) == Path(os.path.expanduser("~/w/h2/j1"))
    assert job_dir_of(["/jobs/j1"], 3) == Path("/jobs/j1")  # a local job's wrapper


def test_a_push_sends_what_is_new_or_different_and_deletes_what_is_gone(tmp_path):
    local = {"code/a.py": (10, 1), "code/b.py": (5, 2), "data/x": (7, 3), "new": (1, 1)}
    remote = {"code/a.py": (10, 1), "code/b.py": (5, 9), "data/x": (8, 3), "old": (4, 4)}
    assert changes(local, remote) == (["code/b.py", "data/x", "new"], ["old"])
    assert changes(local, local) == ([], [])
    assert changes({}, remote) == ([], sorted(remote))


def test_a_manifest_lists_every_file_with_size_and_mtime(tmp_path):
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "sub" / "f").write_bytes(b"abc")
    (tmp_path / "outside").write_bytes(b"12345")
    os.symlink(tmp_path / "outside", tmp_path / "t" / "link")  # shipped as the file it points to
    os.symlink(tmp_path / "gone", tmp_path / "t" / "dangling")  # nothing to ship
    got = manifest(tmp_path / "t")
    assert got == {"sub/f": (3, (tmp_path / "t" / "sub" / "f").stat().st_mtime_ns),
                   "link": (5, (tmp_path / "outside").stat().st_mtime_ns)}
    assert manifest(tmp_path / "missing") == {}


def test_lines_streamed_home_go_to_the_hosts_logs_and_the_metrics(tmp_path):
    from hora.jobs.remote_hosts import JobLines
    from hora.jobs.spec import MetricDefinition
    from hora.jobs.store import JobStore

    store = JobStore(tmp_path / "home")
    store.create("j", {})
    (tmp_path / "job" / "logs").mkdir(parents=True)
    lines = JobLines(tmp_path / "job", (MetricDefinition("loss", r"loss=([0-9.]+)"),), str(store.home), "j", 2)
    lines.line("3", "stdout", "[algo-2 rank 3] step 1 loss=0.25")
    lines.line("0", "stderr", "[algo-1 rank 0] Traceback (most recent call last):")
    lines.line("ps0", "stderr", "a server's line")
    lines.close()
    algo2 = (tmp_path / "job" / "logs" / "algo-2.log").read_text()
    assert algo2.endswith("Z [algo-2 rank 3]<stdout> step 1 loss=0.25\n")
    algo1 = (tmp_path / "job" / "logs" / "algo-1.log").read_text().splitlines()
    assert algo1[0].endswith("[algo-1 rank 0]<stderr> Traceback (most recent call last):")
    assert algo1[1].endswith("[ps0]<stderr> a server's line")
    assert [(n, v, h, r, a) for n, v, _, h, r, a in store.metrics("j")] == [("loss", 0.25, "algo-2", 3, 2)]


def test_a_slurm_cluster_is_parsed_kept_and_rebuilt(tmp_path):
    spec = _spec(tmp_path, {"slurm": True, "work_dir": "/scratch/{host}", "python": "/opt/py/bin/python"},
                 instance_count=2)
    assert spec.cluster == ClusterSpec((), work_dir="/scratch/{host}", python="/opt/py/bin/python", backend="slurm")
    assert spec_from_dict(spec.to_dict()) == spec
    resolved = ClusterSpec(("n1", "n2"), backend="slurm", slurm_job_id="42")  # as the job starts in the allocation
    assert cluster_from_dict(resolved.to_dict()) == resolved
    assert _spec(tmp_path, {"hosts": ["a"]}).cluster.slurm is False  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("cluster", "problem"),
    [
        ({"slurm": True, "hosts": ["a"]}, "slurm: true takes the hosts from the Slurm allocation (its nodes are "
         "algo-1..N); remove cluster.hosts and cluster.hostfile, or remove slurm to run on those hosts over SSH"),
        ({"slurm": True, "hostfile": "hosts.txt"}, "remove cluster.hosts and cluster.hostfile"),
        ({"slurm": True, "ssh_port": 22, "ssh_options": ["A=b"]},
         "cluster: slurm: true reaches the nodes with srun, not SSH: remove cluster.ssh_port, cluster.ssh_options"),
        ({"slurm": True, "ssh_identity_file": "id"}, "not SSH: remove cluster.ssh_identity_file"),
        ({"slurm": "yes"}, "cluster.slurm must be true or false, got 'yes'"),
        ({"slurm": True, "work_dir": "rel"}, "must be absolute or start with ~/"),
    ],
)
def test_a_slurm_cluster_refuses_hosts_and_ssh_settings(tmp_path, cluster, problem):
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, cluster)
    assert problem in str(err.value)


def test_hosts_on_the_command_line_are_refused_for_a_slurm_cluster():
    with pytest.raises(ConfigError, match=r"says slurm: true .* but --hosts names hosts to reach over SSH"):
        cli_cluster(ClusterSpec((), backend="slurm"), "a", None, 1)
