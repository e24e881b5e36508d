"""One host of a job on Kubernetes: ``python -m hora.jobs.k8s_entry ...``, the command of every pod of the Indexed
Job that ``hora job manifest`` writes (:mod:`hora.jobs.k8s_manifest`).

Pod ``JOB_COMPLETION_INDEX`` = i is host ``algo-(i+1)``. It

1. resolves every host's DNS name (``--peer-dns``, ``<job>-{index}.<service>``; the headless Service gives each pod
   one), retrying until the spec's ``master_timeout``, and appends ``address algo-K`` lines to ``/etc/hosts`` so
   the names in ``SM_HOSTS`` resolve as on SageMaker;
2. lays out the host's ``/opt/ml`` tree (``--base``): the contract files from the mounted ConfigMap
   (``--contract``), the code (``--code``, a mounted ConfigMap, unless the image has it in ``/opt/ml/code``), the
   ``s3://`` channels fetched for this host (:mod:`hora.jobs._stage`, File and Pipe mode, ShardedByS3Key), the
   checkpoints;
3. forms one hora job across the pods without SSH: algo-1 serves hora's rendezvous store on
   ``--rendezvous-port`` with the job's secret (``HORA_SECRET``, from the manifest's Secret); the other pods wait
   for it (an authenticated connection) and every pod starts its own ``processes_per_host`` ranks with hora's
   worker contract (:func:`hora.config.worker_env.worker_env`), each through hora job's rank wrapper
   (:mod:`hora.jobs._entry`: the host's ``SM_*`` variables, ``[algo-K rank R]`` lines on the pod's output);
4. supervises them as hora run does (the first failure stops the others: SIGTERM, SIGKILL after ``stop_grace``;
   a SIGTERM to the pod reaches every rank) and ends with the first failure's exit code;
5. on algo-1, archives ``model/`` and ``output/data`` to ``<output_path>/<job>/output/`` (:func:`outcome.archive`),
   and writes a failure reason to the pod's termination message (``kubectl describe pod``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hora._proc import die_with_parent, kill_group
from hora._runtime.bootstrap import read_secret
from hora._runtime.rendezvous import RendezvousClient, RendezvousServer
from hora.config import Config
from hora.config.settings import env_names
from hora.config.variables import environment, read
from hora.config.worker_env import worker_env
from hora.errors import ConfigError, HoraError
from hora.jobs import _stage
from hora.jobs.cluster import host_name, host_names
from hora.jobs.lifecycle import entry_command, unattended_settings
from hora.jobs.outcome import archive, describe_code, traceback_tail
from hora.jobs.plan import JobPlan
from hora.jobs.records import RankEnd, host_says
from hora.jobs.remote_spec import Manifest
from hora.jobs.sagemaker_env import HostLayout, num_gpus, sm_environment, to_cmd_args
from hora.jobs.spec import JobSpec, spec_from_dict
from hora.jobs.store import write_private
from hora.runner.result import Failure, root_cause

__all__ = ["main", "resolve_hosts"]

#: The job's one attempt inside a pod (the Job's retries are new pods).
ATTEMPT = 1
POLL_SECONDS = 0.1
#: How long the other ranks of this pod get to end on their own after one failed, before SIGTERM (hora run's).
SETTLE_SECONDS = 0.5


def resolve_hosts(template: str, count: int, timeout: float) -> list[str]:
    """The IPv4 address of every host, ``template`` formatted with its ``index`` (0 for algo-1), retried until
    ``timeout`` seconds have passed.

    Raises:
        HoraError: a host's name never resolved; the message names the host and its DNS name.
    """
    names = [template.format(index=i) for i in range(count)]
    found: dict[int, str] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        for i, name in enumerate(names):
            if i in found:
                continue
            try:
                found[i] = str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
            except OSError as exc:
                errors[i] = str(exc)
        if len(found) == count:
            return [found[i] for i in range(count)]
        if time.monotonic() > deadline:
            missing = [i for i in range(count) if i not in found]
            raise HoraError(
                "waited " + f"{timeout:g}s for the pods of the job to get their DNS names and "
                + ", ".join(f"{host_name(i)} ({names[i]}: {errors.get(i)})" for i in missing)
                + " never resolved: is the pod running (kubectl get pods -l hora-job=...) and the headless Service "
                "applied? Raise master_timeout in the spec if pods start slowly"
            )
        time.sleep(1.0)


def _add_hosts(path: Path, addresses: list[str], host: str) -> None:
    """``address algo-K`` lines at the end of ``path`` (the pod's /etc/hosts), so SM_HOSTS names resolve."""
    lines = "# the hosts of this hora job\n" + "".join(
        f"{addr}\t{name}\n" for addr, name in zip(addresses, host_names(len(addresses)))
    )
    try:
        with open(path, "a") as f:
            f.write(lines)
    except OSError as exc:
        host_says(host, f"cannot add the job's hosts to {path} ({exc.strerror}): the names algo-1..N do not resolve "
                        "in this pod; the ranks use the addresses")


def _layout(args: argparse.Namespace, spec: JobSpec, host: str) -> HostLayout:
    """The host's /opt/ml tree from the mounted ConfigMaps."""
    layout = HostLayout(Path(args.base))
    layout.create()
    contract = Path(args.contract)
    files = {"hyperparameters.json": "hyperparameters.json", "inputdataconfig.json": "inputdataconfig.json",
             f"resourceconfig-{host}.json": "resourceconfig.json"}
    for source, target in files.items():
        try:
            text = (contract / source).read_text()
        except OSError as exc:
            raise ConfigError(f"the contract file {contract / source} cannot be read ({exc.strerror}): is the "
                              "ConfigMap <name>-contract mounted there (kubectl apply the whole manifest)?") from None
        write_private(layout.config_dir / target, text)
    if args.code:  # a ConfigMap volume holds its files behind ..data links: copy the files, not the links
        shutil.copytree(args.code, layout.code_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("..*"))
    if not (layout.code_dir / spec.entry_point).exists():
        raise ConfigError(f"the entry point {layout.code_dir / spec.entry_point} is not in this pod: build the code "
                          f"into the image at {layout.code_dir}, or write the manifest without --code-in-image")
    return layout


class _Ranks:
    """This pod's ranks: started through hora job's wrapper, stopped together (see the module docstring)."""

    def __init__(self, host: str, grace: float) -> None:
        self.host, self.grace = host, grace
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping: float | None = None  # when SIGTERM went to every rank
        self.signalled: int | None = None

    def start(self, rank: int, workdir: Path, env: dict[str, str]) -> None:
        self.procs[rank] = subprocess.Popen(
            [sys.executable, "-m", "hora.jobs._entry", str(workdir)], env=env, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent,  # the ranks' groups end with this pod's entry
        )

    def on_signal(self, signum: int, frame: object) -> None:
        if self.signalled is not None:  # a second one: no more patience
            self.kill()
        self.signalled = signum
        self.terminate()

    def terminate(self) -> None:
        if self.stopping is None:
            self.stopping = time.monotonic()
        for proc in self.procs.values():
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        for proc in self.procs.values():
            kill_group(proc.pid, signal.SIGKILL)

    def wait(self) -> tuple[int, int | None]:
        """(exit code, rank that failed first or None) once every rank has ended."""
        first: tuple[int, int] | None = None
        failed_at = None
        while any(p.poll() is None for p in self.procs.values()):
            for rank, proc in self.procs.items():
                code = proc.poll()
                if code not in (None, 0) and first is None:
                    first = (rank, code)
                    failed_at = time.monotonic()
            if failed_at is not None and self.stopping is None and time.monotonic() > failed_at + SETTLE_SECONDS:
                host_says(self.host, f"rank {first[0] if first else '?'} failed; stopping this host's other ranks")
                self.terminate()
            if self.stopping is not None and time.monotonic() > self.stopping + self.grace:
                self.kill()
            time.sleep(POLL_SECONDS)
        for rank, proc in self.procs.items():
            if proc.returncode != 0 and first is None:
                first = (rank, proc.returncode)
        if first is None:
            return (128 + self.signalled if self.signalled else 0), None
        code = first[1]
        return (code if code >= 0 else 128 - code), first[0]


def _failure(layout: HostLayout, workdir: Path, host: str, rank: int | None, code: int) -> str:
    """The failure reason: the script's output/failure file, else the failed rank's exit and traceback tail."""
    if layout.failure_file.is_file():
        text = layout.failure_file.read_text(errors="replace").strip()
        if text:
            return f"AlgorithmError: {host} wrote output/failure:\n{text[:4096]}"
    ends = RankEnd.read_all(workdir, ATTEMPT)
    # hora run's choice of the root cause: not a rank that only reacted to another's end (ShutdownError, ...)
    cause = root_cause([Failure(e.rank, e.host, e.pid, e.returncode, list(e.tail), e.ended)
                        for e in ends.values() if e.returncode != 0])
    chosen = cause.rank if cause is not None else rank
    end = ends.get(chosen) if chosen is not None else None
    if end is None:
        return f"AlgorithmError: {host}'s ranks ended with exit code {code}"
    lines = [f"AlgorithmError: host {host}, rank {end.rank} (pid {end.pid}) failed: {describe_code(end.returncode)}"]
    tail = traceback_tail(list(end.tail))
    return "\n".join([*lines, *(["last lines of its stderr:", *[f"  {t}" for t in tail]] if tail else [])])


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hora.jobs.k8s_entry", description=__doc__.split("\n\n")[0])
    p.add_argument("--contract", required=True, help="the mounted contract ConfigMap")
    p.add_argument("--base", default="/opt/ml", help="the host's SageMaker tree")
    p.add_argument("--workdir", required=True, help="a private directory for the wrappers' plan, logs, records")
    p.add_argument("--peer-dns", required=True, help="every host's DNS name, with {index} (0 for algo-1)")
    p.add_argument("--interface", default="eth0", help="the pod's network interface (SM_NETWORK_INTERFACE_NAME)")
    p.add_argument("--rendezvous-port", type=int, default=29400, help="where algo-1 serves the rendezvous")
    p.add_argument("--torch-port", type=int, default=29500, help="MASTER_PORT for torch.distributed")
    p.add_argument("--code", help="the mounted code ConfigMap (default: the image has the code in BASE/code)")
    p.add_argument("--hosts-file", default="/etc/hosts", help="where the algo-K names are added")
    p.add_argument("--termination-log", default="/dev/termination-log", help="where the failure reason goes")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    raw_index = read("JOB_COMPLETION_INDEX")
    try:
        index = int(raw_index or "")
    except ValueError:
        raise ConfigError(
            f"JOB_COMPLETION_INDEX={raw_index!r} is not a pod index: this entry point is the command of the Indexed "
            "Job that hora job manifest writes (completionMode: Indexed sets it)"
        ) from None
    try:
        spec = spec_from_dict(json.loads(Path(args.contract, "job.json").read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{Path(args.contract, 'job.json')} is not a job that hora job manifest wrote ({exc}): "
                          "mount the ConfigMap <name>-contract there (kubectl apply the whole manifest)") from None
    count, pph = spec.instance_count, spec.processes_per_host
    if not 0 <= index < count:
        raise ConfigError(f"JOB_COMPLETION_INDEX={index}, but the job has {count} host(s) (indexes 0..{count - 1})")
    host = host_name(index)
    secret = read_secret(Config.resolve())
    if secret is None:
        raise ConfigError("HORA_SECRET is not set: the manifest gives it from the Secret <name>-secret; apply the "
                          "whole manifest (kubectl apply -f)")
    addresses = resolve_hosts(args.peer_dns, count, spec.master_timeout)
    host_says(host, f"hosts {', '.join(f'{h}={a}' for h, a in zip(host_names(count), addresses))}")
    _add_hosts(Path(args.hosts_file), addresses, host)
    layout = _layout(args, spec, host)
    handles = [_stage.stage_channel(ch, layout.data_dir, index, count, lambda m: host_says(host, m))
               for ch in spec.inputs]
    restored = _stage.restore_checkpoints(spec.checkpoint_path, layout.checkpoint_dir) if spec.checkpoint_path else {}
    workdir = Path(args.workdir)
    for d in ("hora", "logs", "hosts"):
        (workdir / d).mkdir(mode=0o700, parents=True, exist_ok=True)
    link = workdir / "hosts" / host  # the wrapper runs the script in <workdir>/hosts/<host>/code
    if not link.exists():
        link.symlink_to(layout.root.resolve(), target_is_directory=True)
    cpus = os.cpu_count() or 1
    host_env = sm_environment(spec, layout, host, cpus, num_gpus())
    write_private(workdir / "hora" / f"env-{host}.json", json.dumps(host_env, indent=1))
    base_env = environment()
    settings = unattended_settings(dict(spec.run_settings), base_env)
    if "start_timeout" not in settings and not any(base_env.get(v) for v in env_names("start_timeout")):
        # pods start minutes apart (scheduling, image pulls): the ranks wait for each other as long as the pods do
        settings["start_timeout"] = spec.master_timeout
    JobPlan(
        job_name=spec.job_name, home=str(workdir / "store"), hosts=tuple(host_names(count)),
        addresses=tuple(addresses), network="kubernetes", namespaces=(), interface=args.interface,
        master_timeout=spec.master_timeout, connect_timeout=spec.master_timeout, grace=spec.stop_grace,
        run_settings=settings, mpi_exports=dict(spec.mpi_exports), processes_per_host=pph,
        command=tuple(entry_command(spec, to_cmd_args(json.loads(host_env["SM_HPS"])), sys.executable)),
        python=sys.executable, strategy=spec.strategy, parameter_server=None,
        metric_definitions=(),  # the lines are the pod's output; nothing here keeps a job store
        echo=True,
    ).write(workdir)

    # One job across the pods: algo-1 serves the rendezvous, the others wait for it, then all start their ranks.
    job_id = hashlib.sha256(secret + spec.job_name.encode()).hexdigest()[:16]
    rendezvous = (addresses[0], args.rendezvous_port)
    server = None
    if index == 0:
        server = RendezvousServer(secret, host=addresses[0], port=args.rendezvous_port)
        try:
            server.start()
        except OSError as exc:
            raise ConfigError(f"algo-1 cannot serve the rendezvous on {addresses[0]}:{args.rendezvous_port}: "
                              f"{exc.strerror}") from None
    else:
        try:
            RendezvousClient(*rendezvous, secret, index * pph, "k8s-probe",
                             time.monotonic() + spec.master_timeout).close()
        except HoraError as exc:
            raise HoraError(f"{host} waited {spec.master_timeout:g}s for algo-1 to serve the rendezvous at "
                            f"{rendezvous[0]}:{rendezvous[1]} and it never did ({exc}); see algo-1's pod: kubectl "
                            "logs, kubectl describe pod") from None
    ranks = _Ranks(host, spec.stop_grace)
    signal.signal(signal.SIGTERM, ranks.on_signal)
    signal.signal(signal.SIGINT, ranks.on_signal)
    try:
        for local in range(pph):
            rank = index * pph + local
            env = worker_env(
                base_env, rank=rank, size=count * pph, local_rank=local, local_size=pph, cross_rank=index,
                cross_size=count, host=host, rendezvous=rendezvous, secret=secret, job_id=job_id,
                master_addr=addresses[0], master_port=args.torch_port, bind_addr=addresses[index],
                settings=settings, cpus=cpus,
            )
            env["HORA_JOB_ATTEMPT"] = str(ATTEMPT)
            ranks.start(rank, workdir, env)
        code, failed = ranks.wait()
    finally:
        ranks.terminate()
        ranks.kill()
        for handle in handles:
            handle.close()
        if server is not None:
            server.shutdown()
    return _finish(args, spec, layout, workdir, host, code, failed, restored)


def _finish(args: argparse.Namespace, spec: JobSpec, layout: HostLayout, workdir: Path, host: str, code: int,
            failed: int | None, restored: Manifest) -> int:
    """Checkpoints out (every host), artifacts and the failure reason (algo-1); the pod's exit code."""
    reason = _failure(layout, workdir, host, failed, code) if code != 0 else None
    try:
        if spec.checkpoint_path and layout.checkpoint_dir.is_dir():
            _stage.upload_changed(layout.checkpoint_dir, spec.checkpoint_path, restored)
    except (HoraError, OSError) as exc:
        host_says(host, f"copying the checkpoints to {spec.checkpoint_path} failed: {exc}")
    if host == "algo-1":
        artifacts, problem = archive(workdir, [layout], spec.output_path, spec.job_name)
        for what, where in artifacts.items():
            host_says(host, f"{what}: {where}")
        if problem:
            host_says(host, problem)
            if code == 0:
                code, reason = 1, f"ClientError: {problem}"
    if reason:
        host_says(host, reason)
        try:
            Path(args.termination_log).write_text(reason[:4096])  # Kubernetes keeps at most 4096 bytes of it
        except OSError:
            pass
    return code


def main() -> None:
    args = _parse(sys.argv[1:])
    host = "pod"
    try:
        code = run(args)
    except HoraError as exc:
        host_says(host, str(exc))
        try:
            Path(args.termination_log).write_text(str(exc)[:4096])
        except OSError:
            pass
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
