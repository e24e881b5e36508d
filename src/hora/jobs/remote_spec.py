"""The spec's ``cluster:`` section (``hora job run --hosts``/``--hostfile``, ``--slurm``, ``--ray``): the real hosts
a job runs on (over SSH, the nodes of a Slurm allocation, or one per node of a Ray cluster), how to reach them, and
where each keeps the job's tree; plus the pure logic of shipping trees to them (what changed since the last push,
from two manifests) and of naming the per-host work directory.

The hosts themselves are :mod:`hora.jobs.remote_hosts` (with srun in place of ssh: :mod:`hora.jobs.slurm_hosts`;
the Ray placement: :mod:`hora.jobs.ray_hosts`); what runs on each host is :mod:`hora.jobs._remote_sync`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hora.errors import ConfigError
from hora.jobs.checks import type_name, unknown_field

__all__ = [
    "BACKENDS", "CLUSTER_FIELDS", "DEFAULT_WORK_DIR", "SSH_FIELDS", "ClusterSpec", "Manifest", "changes", "cli_cluster",
    "cluster_from_dict",
    "hostfile_hosts", "job_work_dir", "manifest", "parse_cluster", "parse_host_list", "with_hosts",
]  # fmt: skip

CLUSTER_FIELDS = ("hosts", "hostfile", "slurm", "ssh_port", "ssh_identity_file", "ssh_options", "work_dir", "python",
                  "ray")
#: The keys that only mean something over SSH (refused with ``slurm`` and ``ray``).
SSH_FIELDS = ("hosts", "hostfile", "ssh_port", "ssh_identity_file", "ssh_options")
#: How the hosts are reached: over SSH, with srun inside a Slurm allocation, or placed on a Ray cluster.
BACKENDS = ("ssh", "slurm", "ray")
#: Where each host keeps its jobs (``<work_dir>/<job>``) and its copy of the last shipped trees (``.cache``):
#: relative to the SSH user's home there, as ``~`` is expanded by the host itself.
DEFAULT_WORK_DIR = "~/.hora/remote"
_HOST = re.compile(r"^[A-Za-z0-9_.@:\[\]-]+$")  # a host name, user@host or an address; nothing a shell reads

#: One file of a tree: (size in bytes, modification time in ns); a manifest maps relative paths to them.
Manifest = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class ClusterSpec:
    """The real hosts of a job (``hosts[0]`` is algo-1) and how to reach them (``backend``): over SSH (hora run's
    conventions), with srun inside a Slurm allocation (``slurm``), or one host per node of the Ray cluster at
    ``address`` (``ray``; the hosts are known once placed)."""

    hosts: tuple[str, ...]
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    ssh_options: tuple[str, ...] = ()
    #: each host's root for jobs; ``~`` is that host's home, ``{host}`` the host's name as given in ``hosts``
    work_dir: str = DEFAULT_WORK_DIR
    #: the Python on every host that runs hora and the script (default: this supervisor's, at the same path)
    python: str | None = None
    #: how the hosts are reached (:data:`BACKENDS`). ``slurm``: the nodes of the Slurm allocation the job is started
    #: in (slurm_hosts.py; ``hosts`` and ``slurm_job_id`` are filled in when the job starts); ``ray``: placed on the
    #: Ray cluster at ``address`` (ray_hosts.py)
    backend: str = "ssh"
    address: str | None = None
    slurm_job_id: str | None = None

    @property
    def slurm(self) -> bool:
        return self.backend == "slurm"

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "ssh_port": self.ssh_port, "ssh_identity_file": self.ssh_identity_file,
                "ssh_options": list(self.ssh_options), "work_dir": self.work_dir, "python": self.python,
                "backend": self.backend, "address": self.address, "slurm_job_id": self.slurm_job_id}


def cluster_from_dict(data: Mapping[str, Any] | None) -> ClusterSpec | None:
    """Rebuild from :meth:`ClusterSpec.to_dict` (the store's copy of a spec; already validated)."""
    if not data:
        return None
    return ClusterSpec(tuple(data["hosts"]), data.get("ssh_port"), data.get("ssh_identity_file"),
                       tuple(data.get("ssh_options") or ()), data.get("work_dir") or DEFAULT_WORK_DIR,
                       data.get("python"), data.get("backend") or "ssh", data.get("address"), data.get("slurm_job_id"))


def parse_host_list(text: str, what: str = "--hosts") -> list[str]:
    """``"h1,h2"`` -> ``["h1", "h2"]``; every name once, nothing a shell would read."""
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise ConfigError(f"{what} is empty; give the hosts as h1,h2 (algo-1 is the first)")
    for h in hosts:
        if not _HOST.match(h):
            raise ConfigError(f"{what}: {h!r} is not a host name, user@host or address")
        if hosts.count(h) > 1:
            raise ConfigError(f"{what} names host {h!r} twice; a job runs one host algo-K per machine")
    return hosts


def hostfile_hosts(path: str) -> list[str]:
    """The hosts of an Open MPI / Horovod style hostfile, in order (``slots=`` is read and not used: a job's
    ranks per host are its ``processes_per_host``)."""
    from hora.runner.hosts import parse_hostfile

    return parse_host_list(",".join(h.host for h in parse_hostfile(path)), f"hostfile {path}")


def parse_cluster(value: Any, base: Path, instance_count: int, add: Any) -> ClusterSpec | None:
    """The spec's ``cluster:`` mapping (None: the job runs on this machine; no hosts: they come from ``hora job run
    --hosts``, or from the Slurm allocation with ``slurm: true``). Problems go to ``add``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        add(f"cluster must be a mapping ({', '.join(CLUSTER_FIELDS)}), got {type_name(value)}")
        return None
    for key in value:
        if key not in CLUSTER_FIELDS:
            add(unknown_field(str(key), CLUSTER_FIELDS, " in cluster"))
    slurm = _slurm(value, add)  # with it, hosts and hostfile are refused: the hosts come from the allocation
    ray = value.get("ray")
    if ray is not None:
        if not isinstance(ray, str) or not ray.strip() or any(ch.isspace() for ch in ray):
            add(f"cluster.ray must be the Ray cluster's address (auto, HOST:PORT or ray://HOST:PORT), got {ray!r}")
        ssh = [k for k in SSH_FIELDS if value.get(k) is not None]
        if ssh:
            add(f"cluster.ray cannot go with cluster.{', cluster.'.join(ssh)}: on a Ray cluster the hosts are its "
                "nodes, placed by Ray and reached through hora's own agents (no SSH); keep ray, or drop it to run "
                "over SSH")
        if slurm:
            add("cluster: give slurm: true (the nodes of a Slurm allocation) or ray (a Ray cluster), not both")
    hosts: list[str] = []
    try:
        if value.get("hosts") is not None and value.get("hostfile") is not None:
            add("cluster: give hosts or hostfile, not both")
        elif isinstance(value.get("hosts"), list) and value["hosts"]:
            hosts = parse_host_list(",".join(str(h) for h in value["hosts"]), "cluster.hosts")
        elif isinstance(value.get("hostfile"), str):
            hosts = hostfile_hosts(str(base / os.path.expanduser(value["hostfile"])))
        elif value.get("hosts") is not None or value.get("hostfile") is not None:
            add("cluster.hosts must be a non-empty list of host names (algo-1 first), cluster.hostfile a path")
    except ConfigError as exc:
        add(str(exc))
    if hosts and len(hosts) != instance_count:
        add(f"cluster lists {len(hosts)} host(s) but instance_count is {instance_count}: each host is one instance "
            f"(algo-1..N in order); set instance_count: {len(hosts)} or list {instance_count} host(s)")
    port = value.get("ssh_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        add(f"cluster.ssh_port must be a port number (1-65535), got {port!r}")
        port = None
    options = value.get("ssh_options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) and "=" in o for o in options):
        add(f"cluster.ssh_options must be a list of ssh -o options (Name=value), got {options!r}")
        options = []
    strings: dict[str, str | None] = {}
    for key in ("ssh_identity_file", "work_dir", "python"):
        v = value.get(key)
        if v is not None and (not isinstance(v, str) or not v or "\0" in v or "\n" in v):
            add(f"cluster.{key} must be a non-empty string (a path), got {v!r}")
            v = None
        strings[key] = v
    work_dir = strings["work_dir"] or DEFAULT_WORK_DIR
    if not (work_dir.startswith(("/", "~/")) or work_dir == "~"):
        add(f"cluster.work_dir {work_dir!r} must be absolute or start with ~/ (a path on each host)")
    python = strings["python"]
    if python is not None and not python.startswith("/"):
        add(f"cluster.python {python!r} must be an absolute path (the Python on every host)")
    identity = strings["ssh_identity_file"]
    if isinstance(ray, str):
        return ClusterSpec((), work_dir=work_dir, python=python, backend="ray", address=ray.strip())
    return ClusterSpec(tuple(hosts), port, str(base / os.path.expanduser(identity)) if identity else None,
                       tuple(options), work_dir, python, "slurm" if slurm else "ssh")


def _slurm(value: Mapping[str, Any], add: Any) -> bool:
    """``cluster.slurm``; with it, the keys that name hosts or SSH settings are refused."""
    slurm = value.get("slurm", False)
    if not isinstance(slurm, bool):
        add(f"cluster.slurm must be true or false, got {slurm!r}")
        return False
    if slurm:
        if value.get("hosts") is not None or value.get("hostfile") is not None:
            add("cluster: slurm: true takes the hosts from the Slurm allocation (its nodes are algo-1..N); remove "
                "cluster.hosts and cluster.hostfile, or remove slurm to run on those hosts over SSH")
        ssh = [f"cluster.{k}" for k in SSH_FIELDS[2:] if value.get(k) is not None]
        if ssh:
            add(f"cluster: slurm: true reaches the nodes with srun, not SSH: remove {', '.join(ssh)}")
    return slurm


def cli_cluster(cluster: ClusterSpec | None, hosts: str | None, hostfile: str | None,
                instance_count: int, ray: str | None = None) -> ClusterSpec:
    """The spec's cluster with ``--hosts``/``--hostfile`` or ``--ray`` of ``hora job run`` (or ``hora job clean``)."""
    if ray is not None:
        if hosts or hostfile:
            raise ConfigError("give --hosts/--hostfile (SSH hosts) or --ray (a Ray cluster), not both")
        if cluster is not None and (cluster.hosts or cluster.ssh_port or cluster.ssh_identity_file
                                    or cluster.ssh_options or cluster.slurm):
            raise ConfigError("--ray: the spec's cluster: names SSH hosts or settings, or slurm; on a Ray cluster the "
                              "hosts are its nodes (no SSH): remove them from the spec, or run without --ray")
        if not ray.strip():
            raise ConfigError("--ray needs the Ray cluster's address: auto, HOST:PORT or ray://HOST:PORT")
        base = cluster or ClusterSpec(())
        return ClusterSpec((), work_dir=base.work_dir, python=base.python, backend="ray", address=ray.strip())
    if cluster is not None and cluster.backend == "ray":
        raise ConfigError("--hosts/--hostfile: the spec's cluster: names a Ray cluster (cluster.ray); remove it to "
                          "run over SSH, or run without --hosts/--hostfile")
    if hosts and hostfile:
        raise ConfigError("give --hosts or --hostfile, not both")
    if cluster is not None and cluster.slurm:
        raise ConfigError(f"the spec's cluster says slurm: true (the nodes of a Slurm allocation) but --"
                          f"{'hosts' if hosts else 'hostfile'} names hosts to reach over SSH: remove slurm from the "
                          "spec's cluster, or leave out the hosts")
    names = parse_host_list(hosts) if hosts else hostfile_hosts(hostfile or "")
    if instance_count and len(names) != instance_count:
        raise ConfigError(f"{len(names)} host(s) given but the spec's instance_count is {instance_count}: each host "
                          f"is one instance (algo-1..N in order); set instance_count: {len(names)} in the spec or "
                          f"give {instance_count} host(s)")
    return with_hosts(cluster, names)


def with_hosts(cluster: ClusterSpec | None, hosts: list[str]) -> ClusterSpec:
    """The spec's cluster (or a default one) with the hosts given on the command line."""
    if cluster is None:
        return ClusterSpec(tuple(hosts))
    return ClusterSpec(tuple(hosts), cluster.ssh_port, cluster.ssh_identity_file, cluster.ssh_options,
                       cluster.work_dir, cluster.python)


def job_work_dir(work_dir: str, job_name: str, host: str) -> str:
    """The job's directory on ``host`` as that host's shell sees it (``~`` still to be expanded there)."""
    return f"{work_dir.replace('{host}', host).rstrip('/')}/{job_name}"


def changes(local: Manifest, remote: Manifest) -> tuple[list[str], list[str]]:
    """What a push must send (files new or different in size or modification time) and delete (files the host
    has that the local tree no longer has), both sorted."""
    send = sorted(p for p, meta in local.items() if tuple(remote.get(p, ())) != tuple(meta))
    delete = sorted(p for p in remote if p not in local)
    return send, delete


def manifest(root: Path) -> Manifest:
    """Every regular file under ``root`` (symlinks followed, as they are shipped) with its size and mtime."""
    out: Manifest = {}
    if not root.is_dir():
        return out
    for dirpath, _, files in os.walk(root, followlinks=True):
        for name in files:
            path = Path(dirpath, name)
            try:
                st = path.stat()
            except OSError:
                continue  # a dangling link: nothing to ship
            out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out
