"""A job on real hosts over SSH (the spec's ``cluster:``, ``hora job run --hosts``): the supervisor stays on this
machine (store, logs, job directory) and reaches each host with hora run's SSH conventions
(:class:`hora.runner.ssh.SshOptions`: BatchMode, keepalives every 5 s, the host checks in parallel first).

- **set-up** (:meth:`RemoteHosts.probe`): each host creates its job directory (``<work_dir>/<job>``) and says the
  interface and address it reaches the other hosts through (``ip -o route get``), and its CPUs and GPUs.
- **shipping** (:meth:`RemoteHosts.push`): the supervisor builds each host's tree here as for a local job (code,
  config, File channels), then sends each host only the files that differ from that host's cache of its last push
  (``<work_dir>/.cache/algo-K``; size and modification time, :func:`hora.jobs.remote_spec.changes`), as one tar
  over SSH; the host updates its cache and copies it into the job's tree. ``s3://`` File channels are then fetched
  by each host itself (:meth:`RemoteHosts.stage_s3`); Pipe channels are fed on each host for every attempt
  (:meth:`RemoteHosts.feed_pipes`), a local one from the copy shipped in its tree (:func:`ship_pipe_sources`).
- **launch** (:meth:`RemoteHosts.launch_spec`): hora run's ``launch()`` runs here with the real hosts; each rank's
  wrapper (``_entry --remote``) runs on its host against the job's directory there and echoes its tagged lines,
  which come home through hora run's agent; :class:`JobLines` writes them into the job's logs and parses the
  metrics. A lost host (no keepalive answer for 15 s) ends the attempt with hora run's reason naming it.
- **results** (:meth:`RemoteHosts.pull`): after every attempt, failed or stopped too, ``model/``, ``output/``,
  ``checkpoints/`` and the ranks' end records come back from every host into the local tree, where the job is
  judged and archived as a local one.
- **cleaning** (:func:`clean`): ``hora job clean --hosts`` removes the work directories.

On a Ray cluster (``cluster.backend`` ``ray``) the hosts are placed by :class:`hora.jobs.ray_hosts.RayHosts` at
:meth:`RemoteHosts.probe` (one per node) and reached through their command agents with :mod:`hora.jobs._ray_rsh` in
place of ssh; every step above is the same. Their names are not known to the network: ``addresses`` says where
each is.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hora._proc import die_with_parent
from hora.errors import HoraError, HostError
from hora.jobs.metric_lines import MetricParser, parse_system_metrics_line
from hora.jobs.records import log_line
from hora.jobs.remote_spec import ClusterSpec, changes, job_work_dir, manifest
from hora.jobs.slurm_hosts import SRUN_START_SECONDS, srun_agent
from hora.jobs.store import JobStore
from hora.runner.ssh import SshOptions, advertise_address, preflight, ssh_command

__all__ = ["JobLines", "RemoteHosts", "RemotePipes", "clean", "remote_hosts_of", "ship_pipe_sources"]

#: Seconds one set-up, shipping or pull step may take on a host before the supervisor gives up on it.
STEP_SECONDS = 600.0
_DATA_FILTER: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
_TAG = re.compile(r"^\[(algo-\d+) rank (\d+)\] ?(.*)$", re.S)


def _hora_path() -> str:
    import hora

    return os.path.dirname(os.path.dirname(os.path.abspath(hora.__file__)))


def ssh_options(cluster: ClusterSpec) -> SshOptions:
    if cluster.slurm:  # inside a Slurm allocation: srun in place of ssh (slurm_hosts.py)
        return SshOptions(agent=srun_agent(str(cluster.slurm_job_id)), python=cluster.python,
                          connect_timeout=SRUN_START_SECONDS)
    return SshOptions(port=cluster.ssh_port, identity_file=cluster.ssh_identity_file,
                      options=tuple(cluster.ssh_options), python=cluster.python)


def _sync_command(python: str, *args: str) -> str:
    """The shell command that runs :mod:`hora.jobs._remote_sync` on a host (paths only: nothing secret)."""
    return (f"PYTHONPATH={shlex.quote(_hora_path())} exec {shlex.quote(python)} -m hora.jobs._remote_sync "
            + " ".join(shlex.quote(a) for a in args))


def _run(host: str, ssh: SshOptions, remote: str, stdin: bytes | None = None) -> bytes:
    argv = ssh_command(host, ssh, remote)
    try:
        proc = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                              timeout=STEP_SECONDS, preexec_fn=die_with_parent)  # no ssh outlives the supervisor
    except subprocess.TimeoutExpired:
        raise HostError(f"host {host}: '{remote.split(' -m ')[-1]}' did not end within {STEP_SECONDS:g}s") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise HostError(f"host {host}: '{remote.split(' -m ')[-1]}' failed (exit code {proc.returncode}): "
                        + " / ".join(tail))
    return proc.stdout


def _each(hosts: Sequence[str], work: Callable[[int, str], None]) -> None:
    """``work(index, host)`` on every host at once; one HostError naming every host that failed."""
    problems: dict[int, str] = {}

    def one(i: int, host: str) -> None:
        try:
            work(i, host)
        except (HostError, OSError, ValueError, KeyError, tarfile.TarError) as exc:
            problems[i] = str(exc) if isinstance(exc, HostError) else f"host {host}: {exc}"

    threads = [threading.Thread(target=one, args=(i, h), daemon=True) for i, h in enumerate(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if problems:
        raise HostError("\n  ".join(problems[i] for i in sorted(problems)))


def _address(host: str) -> str:
    name = host.rpartition("@")[2].strip("[]")
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        raise HostError(f"host {host}: the name does not resolve here; list the hosts by a name or address this "
                        "machine resolves") from None


def remote_hosts_of(spec: Any, job_dir: Path, algo: Sequence[str], say: Callable[[str], None]) -> RemoteHosts | None:
    """The hosts of a job spec that names real ones (``cluster:`` with hosts, or a Ray cluster); None: this machine."""
    cluster = spec.cluster
    if cluster is None or not (cluster.hosts or cluster.backend == "ray"):
        return None
    placement = None
    if cluster.backend == "ray":
        from hora.jobs.ray_hosts import RayHosts

        placement = RayHosts(spec, job_dir, say)
    return RemoteHosts(cluster, spec.job_name, algo, say, placement)


class RemoteHosts:
    """The job ``job_name``'s hosts ``algo[i]`` on the real machines ``cluster.hosts[i]``, or on the Ray nodes
    ``placement`` reserves when :meth:`probe` runs."""

    def __init__(self, cluster: ClusterSpec, job_name: str, algo: Sequence[str], say: Callable[[str], None],
                 placement: Any = None) -> None:
        self.cluster, self.job_name, self.algo, self.say = cluster, job_name, list(algo), say
        self.placement = placement
        self.hosts = list(cluster.hosts)
        self.addresses: dict[str, str] = {}  # hosts whose names the network does not know (Ray's): their addresses
        self.ssh = ssh_options(cluster)
        self.python = cluster.python or sys.executable
        self.info: list[dict[str, Any]] = [{} for _ in self.hosts]

    def job_dir(self, index: int) -> str:
        """The job's directory on host ``index``, absolute (after :meth:`probe`)."""
        return str(self.info[index]["dir"])

    def template(self) -> str:
        return job_work_dir(self.cluster.work_dir, self.job_name, "{host}")

    # -- set-up ----------------------------------------------------------------------------------------------
    def probe(self) -> None:
        """Place the hosts (Ray); check every host (hora run's preflight), make the job's directory there, learn its
        interface."""
        if self.placement is not None:
            self.placement.place()
            self.hosts = list(self.placement.hosts)
            self.addresses = dict(zip(self.hosts, self.placement.addresses))
            self.python = self.cluster.python or self.placement.python
            self.ssh = dataclasses.replace(self.placement.ssh, python=self.python)
            self.info = [{} for _ in self.hosts]
        seen = preflight(self.hosts, self.ssh)
        # one host: its route back here (the address it saw the SSH connection come from; through srun, which
        # says none, this machine's address towards it)
        peers = ([self.addresses.get(h) or _address(h) for h in self.hosts] if len(self.hosts) > 1
                 else [seen[self.hosts[0]] or advertise_address(self.hosts, None, seen)])

        def one(i: int, host: str) -> None:
            peer = peers[(i + 1) % len(peers)]
            out = _run(host, self.ssh, _sync_command(self.python, "probe",
                                                     job_work_dir(self.cluster.work_dir, self.job_name, host), peer))
            self.info[i] = json.loads(out.decode().strip().splitlines()[-1])

        _each(self.hosts, one)
        if self.cluster.slurm:
            self.say(f"inside Slurm job {self.cluster.slurm_job_id}: node(s) {', '.join(self.hosts)}, each host's "
                     "processes started there as job steps with srun")
        for i, host in enumerate(self.hosts):
            info = self.info[i]
            self.say(f"{self.algo[i]} is {host}: {info['dir']}, interface {info['interface']} "
                     f"({info['address']}), {info['cpus']} CPU(s), {info['gpus']} GPU(s)")

    # -- shipping --------------------------------------------------------------------------------------------
    def push(self, local_job_dir: Path) -> None:
        """Ship each host its tree (only what changed since its last push) and the job's plan and its env file."""

        def one(i: int, host: str) -> None:
            algo, remote = self.algo[i], self.job_dir(i)
            tree = local_job_dir / "hosts" / algo
            have = json.loads(_run(host, self.ssh, _sync_command(self.python, "manifest", remote, algo)) or b"{}")
            local = manifest(tree)
            send, delete = changes(local, {k: (int(v[0]), int(v[1])) for k, v in have.items()})
            data = io.BytesIO()
            with tarfile.open(fileobj=data, mode="w|", dereference=True) as tar:
                for rel in send:
                    tar.add(tree / rel, arcname=f"tree/{rel}", recursive=False)
                for name in ("plan.json", f"env-{algo}.json"):
                    tar.add(local_job_dir / "hora" / name, arcname=f"hora/{name}")
                for name, listed in (("delete.json", delete), ("times.json", {p: local[p][1] for p in send})):
                    content = json.dumps(listed).encode()
                    member = tarfile.TarInfo(name)
                    member.size = len(content)
                    tar.addfile(member, io.BytesIO(content))
            _run(host, self.ssh, _sync_command(self.python, "apply", remote, algo), data.getvalue())
            size = sum((tree / rel).stat().st_size for rel in send)
            shown = ", ".join(send[:20]) + (f" and {len(send) - 20} more" if len(send) > 20 else "")
            self.say(f"{algo} ({host}): shipped {len(send)} changed file(s), {size} bytes"
                     + (f": {shown}" if send else "") + (f"; removed {len(delete)}" if delete else ""))

        _each(self.hosts, one)

    def stage_s3(self, channels: Sequence[Any], env: dict[str, str]) -> None:
        """Each host fetches the ``s3://`` File channels itself, its own shard of a ShardedByS3Key one; ``env``:
        the S3 variables (endpoint, credentials), sent on the session's stdin, never on a command line."""
        listed = [{"name": ch.name, "uri": ch.uri, "distribution": ch.distribution} for ch in channels]
        s3_env = {k: v for k, v in env.items() if k.startswith(("AWS_", "HORA_S3_"))}

        def one(i: int, host: str) -> None:
            job = json.dumps({"channels": listed, "index": i, "count": len(self.hosts), "env": s3_env}).encode()
            _run(host, self.ssh, _sync_command(self.python, "stage", self.job_dir(i), self.algo[i]), job)
            self.say(f"{self.algo[i]} ({host}): fetched channel(s) {', '.join(ch.name for ch in channels)} from S3")

        if channels:
            _each(self.hosts, one)

    def feed_pipes(self, channels: Sequence[Any], env: dict[str, str]) -> RemotePipes:
        """Start each host's feeder of the Pipe channels for an attempt (``_remote_sync pipe``, one SSH session per
        host, kept open until :meth:`RemotePipes.close`); returns once every host's FIFOs exist. A local channel is
        read from the copy shipped with the tree (:func:`ship_pipe_sources`), an ``s3://`` one by the host."""
        s3_env = {k: v for k, v in env.items() if k.startswith(("AWS_", "HORA_S3_"))}
        pipes = RemotePipes([ch.name for ch in channels])
        try:
            for i, host in enumerate(self.hosts):
                listed = [{"name": ch.name, "distribution": ch.distribution,
                           "uri": ch.uri if ch.is_s3 else self._pipe_source(i, ch)} for ch in channels]
                argv = ssh_command(host, self.ssh, _sync_command(self.python, "pipe", self.job_dir(i), self.algo[i]))
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        preexec_fn=die_with_parent)
                pipes.procs.append((host, proc))
                job = {"channels": listed, "index": i, "count": len(self.hosts), "env": s3_env}
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps(job).encode() + b"\n")
                proc.stdin.flush()
                if proc.stdout.readline().strip() != b"ready":
                    proc.wait()
                    err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                    raise HostError(f"host {host}: the Pipe channels could not be set up: "
                                    + (err.splitlines()[-1] if err else f"ssh exited with {proc.returncode}"))
                self.say(f"{self.algo[i]} ({host}): feeding Pipe channel(s) {', '.join(pipes.names)}")
        except BaseException:
            pipes.close()
            raise
        return pipes

    def _pipe_source(self, index: int, channel: Any) -> str:
        name = f"{PIPE_SOURCES}/{channel.name}"
        if Path(channel.uri).is_file():
            name += f"/{Path(channel.uri).name}"
        return f"{self.job_dir(index)}/hosts/{self.algo[index]}/{name}"

    def reset(self, local_job_dir: Path | None = None) -> None:
        """A retry: empty model/ and output/ on every host (checkpoints/ stay). With ``local_job_dir``, the hosts
        are new instances (a spot reclaim): their checkpoints/ go too, and the local trees (the checkpoints restored
        from checkpoint_path there) are pushed again."""
        extra = ("checkpoints",) if local_job_dir is not None else ()

        def one(i: int, host: str) -> None:
            _run(host, self.ssh, _sync_command(self.python, "reset", self.job_dir(i), self.algo[i], *extra))

        _each(self.hosts, one)
        if local_job_dir is not None:
            self.push(local_job_dir)

    def close(self) -> None:
        """The job is over: release what placed the hosts (Ray's actors and placement group)."""
        if self.placement is not None:
            self.placement.close()

    # -- results ---------------------------------------------------------------------------------------------
    def pull(self, local_job_dir: Path, attempt: int | None) -> None:
        """model/, output/, checkpoints/ and the attempt's records of every host into the local tree (``attempt``
        None: checkpoints/ only, while the attempt runs); a host that cannot be reached is said and skipped (its
        share of the artifacts is missing)."""
        which = "-" if attempt is None else str(attempt)

        def one(i: int, host: str) -> None:
            algo = self.algo[i]
            argv = ssh_command(host, self.ssh, _sync_command(self.python, "pack", self.job_dir(i), algo, which))
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    preexec_fn=die_with_parent)
            tree, records = local_job_dir / "hosts" / algo, local_job_dir / "hora"
            timer = threading.Timer(STEP_SECONDS, proc.kill)
            timer.start()
            unreadable: tarfile.TarError | None = None
            try:
                assert proc.stdout is not None
                with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                    for member in tar:
                        top, _, rest = member.name.partition("/")
                        parts = Path(rest).parts
                        if not (member.isfile() or member.isdir()) or ".." in parts or Path(rest).is_absolute():
                            continue
                        member.name = rest
                        # the data filter (Python >= 3.10.12) also refuses a path a local symlink would lead out
                        tar.extract(member, tree if top == "tree" else records, set_attrs=False, **_DATA_FILTER)
            except tarfile.TarError as exc:  # said below, after why the stream ended (the host was lost)
                unreadable = exc
            finally:
                timer.cancel()
                code = proc.wait()
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            if code != 0:
                program = "its rsh agent" if self.ssh.agent else "ssh"
                raise HostError(f"host {host}: {program} exited with {code}"
                                + (f": {err.splitlines()[-1]}" if err else ""))
            if unreadable is not None:
                raise unreadable

        try:
            _each(self.hosts, one)
        except HostError as exc:
            what = "the checkpoints" if attempt is None else f"the results of attempt {attempt}"
            self.say(f"could not bring back {what} from every host:\n  {exc}")

    # -- launch ----------------------------------------------------------------------------------------------
    def command(self, pph: int) -> list[str]:
        """Each rank's wrapper, finding the job's directory on its own host."""
        return [self.python, "-m", "hora.jobs._entry", "--remote", self.template(), str(pph), *self.hosts]


#: Where a host's tree keeps the shipped copy of a local Pipe channel's source (its feeder reads it there).
PIPE_SOURCES = ".pipe"


def ship_pipe_sources(channels: Sequence[Any], trees: Sequence[Path]) -> None:
    """Copy each local Pipe channel's source into every host's tree (``.pipe/<channel>``) before the push: the host's
    feeder reads it there; the push sends only what changed since the last job."""
    for ch in channels:
        if ch.input_mode != "Pipe" or ch.is_s3:
            continue
        for tree in trees:
            dest = tree / PIPE_SOURCES / ch.name
            if Path(ch.uri).is_file():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ch.uri, dest / Path(ch.uri).name)
            else:
                shutil.copytree(ch.uri, dest, dirs_exist_ok=True)


class RemotePipes:
    """The hosts' Pipe feeders of one attempt, closed like a local channel (:class:`hora.jobs.channels
    .ChannelHandle`): the end of each session's stdin stops its feeders; a feeder's failure becomes ``error``."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.name = ", ".join(names)
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.error: str | None = None

    def close(self) -> None:
        problems = []
        for host, proc in self.procs:
            try:
                out, _ = proc.communicate(timeout=30)  # closes its stdin: the host's feeders stop
            except (OSError, ValueError, subprocess.TimeoutExpired):
                proc.kill()
                out, _ = proc.communicate()
            for line in out.decode(errors="replace").splitlines():
                if line.startswith("{"):
                    problems.append(f"host {host}: {line}")
        self.procs = []
        self.error = "; ".join(problems) or None


class JobLines:
    """hora run's observer for a job on remote hosts: every tagged line its ranks' wrappers echo goes into the
    job's ``logs/<host>.log`` and through the metric parser, and each host's system metrics into the job store,
    here (the hosts cannot reach the job store)."""

    def __init__(self, job_dir: Path, plan_metrics: Any, home: str, job: str, attempt: int) -> None:
        self.logs = job_dir / "logs"
        self.fds: dict[str, int] = {}
        self.parser = MetricParser(plan_metrics, home, job)
        self.attempt = attempt
        self.store, self.job = (JobStore(home) if home else None), job
        self.system_failed = False

    def started(self, ranks: Sequence[tuple[int, str]]) -> None:
        pass

    def line(self, label: str, stream: str, text: str) -> None:
        system = parse_system_metrics_line(text) if stream == "stdout" else None
        if system is not None:  # a host's system metrics (profiler_config), into the store: not a log line
            self._system(*system)
            return
        m = _TAG.match(text)
        host, rank, body = (m.group(1), int(m.group(2)), m.group(3)) if m else ("algo-1", -1, text)
        tag = f"[{host} rank {rank}]" if m else f"[{label}]"
        now = time.time()
        try:
            if host not in self.fds:
                self.fds[host] = os.open(self.logs / f"{host}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self.fds[host], log_line(tag, stream, body, now))
        except OSError:
            pass  # a full disk: the line still reached the terminal
        if m:
            self.parser.feed(body, host, rank, self.attempt, now, tag)

    def _system(self, host: str, samples: list[Any]) -> None:
        if not samples or self.store is None:
            return
        try:
            self.store.add_system_metrics(self.job, [(host, t, name, value) for t, name, value in samples])
        except HoraError as exc:  # a full disk: this batch is lost, the job goes on; said once
            if not self.system_failed:
                self.system_failed = True
                sys.stderr.write(f"hora job: system metrics of {host} lost: {exc}\n")

    def ended(self, exit_code: int, report: str) -> None:
        self.close()

    def close(self) -> None:
        self.parser.flush()
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def clean(cluster: ClusterSpec, job: str | None) -> list[str]:
    """Remove ``<work_dir>/<job>`` (or the whole work dir, the shipping cache included) on every host (every node
    of a Ray cluster); returns what each host removed."""
    if cluster.backend == "ray":
        from hora.jobs import ray_hosts

        return ray_hosts.clean(cluster, job)
    ssh = ssh_options(cluster)
    preflight(list(cluster.hosts), ssh)
    python = cluster.python or sys.executable
    removed = [""] * len(cluster.hosts)

    def one(i: int, host: str) -> None:
        root = cluster.work_dir.replace("{host}", host)
        out = _run(host, ssh, _sync_command(python, "clean", root, *([job] if job else [])))
        removed[i] = f"{host}: {json.loads(out.decode().strip().splitlines()[-1])['removed']}"

    _each(cluster.hosts, one)
    return removed
