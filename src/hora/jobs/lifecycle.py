"""Running one job: set up the hosts, install the code, stage the data, launch the ranks, judge the outcome, and
archive the artifacts — even when the job fails or is stopped.

The supervisor (:class:`JobSupervisor`) plays SageMaker's part: it builds the hosts (directories, addresses, network
namespaces where it can), installs the code (:mod:`.install`), writes the job's plan (:mod:`.plan`), stages the
data, then starts one process tree per
host for each attempt (:mod:`.host_trees`). The master host, algo-1, starts every rank of every host with hora run;
the other hosts wait for it (and report when it never comes); each rank's wrapper (:mod:`hora.jobs._entry`) tags
its output. The outcome and the artifacts are judged and archived by :mod:`.outcome`; the states a job moves
through are in :mod:`.states`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hora._proc import handle_signals
from hora.config.settings import Config, env_names, parse_value
from hora.config.variables import environment
from hora.errors import HoraError, HostStartError, StorageError
from hora.jobs import _stage, netns, parameter_server, spot
from hora.jobs.attempts import Attempts, _timer
from hora.jobs.channels import ChannelHandle
from hora.jobs.cluster import (
    LOOPBACK_INTERFACE,
    host_addresses,
    host_names,
    hosts_file_text,
    resolve_network,
    runtime_dir,
)
from hora.jobs.exporter import JobExporter
from hora.jobs.host_trees import HOST_START_SECONDS, HostTrees
from hora.jobs.install import JobEnvironment
from hora.jobs.outcome import archive, failure_reason
from hora.jobs.plan import JobPlan, ParameterServerPlan
from hora.jobs.records import stderr_line
from hora.jobs.remote_hosts import RemotePipes, remote_hosts_of, ship_pipe_sources
from hora.jobs.remote_spec import Manifest
from hora.jobs.sagemaker_env import (
    HostLayout,
    host_layout,
    num_gpus,
    sm_environment,
    to_cmd_args,
    write_host_config,
)
from hora.jobs.spec import JobSpec
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.jobs.store import JobRecord, JobStore, record_supervisor, write_private
from hora.runner.result import RunResult

__all__ = ["JobSupervisor", "entry_command", "failure_reason", "layouts_of"]


#: Space the supervisor holds back in ``hora/`` while the job runs and frees before recording its end.
RESERVE_NAME = "reserve"
RESERVE_BYTES = 256 * 1024


def _reserve(path: Path) -> None:
    try:
        with open(path, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)  # written, not sparse: the blocks are really taken
    except OSError:
        path.unlink(missing_ok=True)


#: Under hora job the stall shutdown is on by default, at this many times the stall warning time (10 min with
#: the default 60 s): nobody watches the warning of an unattended job. ``hora run`` keeps Horovod's default
#: (never); a spec gets Horovod's behaviour back with ``--stall-check-shutdown-time-seconds 0``.
UNATTENDED_STALL_FACTOR = 10.0


def unattended_settings(settings: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The spec's hora run settings, with the stall shutdown turned on where neither they nor the job's
    environment choose it (and the stall check is not turned off)."""
    def chosen(name: str) -> Any:
        if name in settings:
            return settings[name]
        for var in env_names(name):
            if env.get(var, "") != "":
                return parse_value(name, env[var])
        return None

    if chosen("stall_shutdown_time") is not None or chosen("stall_check_disable"):
        return dict(settings)
    check = chosen("stall_check_time") or Config().stall_check_time
    return {**settings, "stall_shutdown_time": UNATTENDED_STALL_FACTOR * check}


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class _Stop(Exception):
    """A stop signal (``hora job stop``, Ctrl-C, max_run) arrived outside the launch of the ranks."""


def entry_command(spec: JobSpec, user_args: list[str], python: str = sys.executable) -> list[str]:
    """How the toolkit runs each kind of entry point: a package (``setup.py`` in the source dir) as
    ``python -m module``, a ``.py`` file with Python, a ``.sh`` file with ``/bin/sh``, anything else as a program."""
    entry = spec.entry_point
    if os.path.isfile(os.path.join(spec.source_dir, "setup.py")):
        module = entry[:-3] if entry.endswith(".py") else entry
        return [python, "-m", module.replace("/", "."), *user_args]
    if entry.endswith(".py"):
        return [python, entry, *user_args]
    if entry.endswith(".sh"):
        return ["/bin/sh", entry, *user_args]
    return [os.path.join(".", entry), *user_args]


class JobSupervisor(Attempts):
    """Runs one stored job to its end in this process (``hora job run --wait``, or the detached supervisor)."""

    def __init__(self, spec: JobSpec, store: JobStore, echo: bool = True,
                 progress: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.store = store
        self.echo = echo
        self.job_dir = store.job_dir(spec.job_name)
        self.hosts = host_names(spec.instance_count)
        self.layouts = {h: host_layout(self.job_dir, h) for h in self.hosts}
        self._progress = progress
        self._limit: str | None = None  # the time limit that stopped the job: "max_run" or "max_wait" (spot)
        self._reclaimed: str | None = None  # managed spot: the host whose reclaim interrupted this attempt
        self._remote_running = False  # on remote hosts: hora run's launch() of an attempt is running here
        self._synced: dict[str, Manifest] = {}
        self._trained = 0.0  # seconds the attempts so far trained (managed spot: max_run bounds this)
        self._stoppable = True
        self._closers: list[ChannelHandle | RemotePipes] = []
        self._log_file: Any = None
        self._net: netns.HostNetwork | None = None
        self.addresses: list[str] = []
        self.interface = LOOPBACK_INTERFACE
        self._trees = HostTrees(self.job_dir, self.hosts, spec.stop_grace, self.say)
        self._env = JobEnvironment(self.job_dir)
        self._exporter: JobExporter | None = None  # TensorBoard and MLflow (exporter.py), when the spec asks
        self._remote = remote_hosts_of(spec, self.job_dir, self.hosts, self.say)  # None: the hosts are here

    # -- messages --------------------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        if self._log_file is not None:
            try:
                self._log_file.write(f"{stamp}Z {message}\n")
                self._log_file.flush()
            except OSError as exc:  # a full disk: the message still reaches the terminal and the job's record
                self._log_file = None
                stderr_line(f"hora job: cannot write {self.job_dir / 'logs' / 'job.log'} ({exc.strerror}); "
                            "the supervisor's messages go to its stderr from here on")
        if self._log_file is None and self._progress is None:
            stderr_line(f"hora job: {message}")
        if self._progress is not None:
            self._progress(message)

    def _status(self, status: JobStatus, secondary: SecondaryStatus, message: str = "") -> None:
        self.store.transition(self.spec.job_name, status, secondary, message)
        self.say(f"{status} / {secondary}" + (f": {message}" if message else ""))

    # -- the whole job ---------------------------------------------------------------------------------------
    def run(self) -> JobRecord:
        name = self.spec.job_name
        (self.job_dir / "logs").mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.job_dir / "hora").mkdir(mode=0o700, parents=True, exist_ok=True)
        self._log_file = open(self.job_dir / "logs" / "job.log", "a", opener=_private)  # noqa: SIM115 - closed below
        log_file = self._log_file
        _reserve(self.job_dir / "hora" / RESERVE_NAME)
        pid = os.getpid()
        record_supervisor(self.job_dir / "hora", pid)
        start = time.time()
        self.store.update(name, started=start, supervisor_pid=pid)
        # max_run bounds the whole job, or, for a spot job, the time it trains (each attempt's timer: _run_attempt)
        timers = [_timer(self.spec.max_wait, self._max_wait_reached)] if self.spec.max_wait is not None else [
            _timer(self.spec.max_run, self._max_run_reached)]
        timers += spot.schedule_interruptions(self.job_dir, self.spec.spot_interruptions, len(self.hosts))
        with handle_signals(self._on_signal, signal.SIGTERM, signal.SIGINT, spot.INTERRUPT_SIGNAL):
            try:
                self._run_phases(timers)
            finally:
                for timer in timers:
                    timer.cancel()
                self._trees.stop(signal.SIGKILL)
                if self._remote is not None:  # a Ray cluster's actors and placement group
                    self._remote.close()
                if self._exporter is not None:  # the job's end is recorded: its last export
                    self._exporter.finish()
                if self._net is not None:
                    self._net.remove()
                    self._net = None
                shutil.rmtree(runtime_dir(self.job_dir), ignore_errors=True)
                (self.job_dir / "hora" / RESERVE_NAME).unlink(missing_ok=True)
                self._log_file = None
                try:
                    log_file.close()
                except OSError:
                    pass
        return self.store.get(name)

    def _run_phases(self, timers: list[threading.Timer]) -> None:
        name = self.spec.job_name
        status, secondary = JobStatus.Failed, SecondaryStatus.Failed
        reason: str | None = None
        exit_code: int | None = None
        layouts = [self.layouts[h] for h in self.hosts]
        self._exporter = JobExporter.start_for(self.spec, self.store, layouts, self.say)
        try:
            self._status(
                JobStatus.InProgress,
                SecondaryStatus.Starting,
                f"{len(self.hosts)} host(s) x {self.spec.processes_per_host} process(es)",
            )
            self._setup_hosts()
            if self._remote is None:  # on remote hosts the script's packages are the hosts' own (docs/jobs.md)
                self._env.install(self.layouts[self.hosts[0]].code_dir, self.spec.environment, self.spec.max_run,
                                  self.say)
            self._write_plan()
            self._status(JobStatus.InProgress, SecondaryStatus.Downloading, "staging input channels")
            self._stage_inputs()
            status, secondary, reason, exit_code = self._train()
            # From here on a stop signal is only noted: the artifacts are archived whatever comes. (Set inside
            # the try, so a signal that lands just before it still ends up in the except below.)
            self._stoppable = False
        except _Stop:
            self._stoppable = False
            status, secondary, reason = self._stopped_reason(None)
        except HostStartError as exc:
            self._stoppable = False
            status, secondary, reason = JobStatus.Failed, SecondaryStatus.Failed, f"HostError: {exc}"
        except HoraError as exc:
            self._stoppable = False
            status, secondary, reason = JobStatus.Failed, SecondaryStatus.Failed, f"ClientError: {exc}"
        except Exception as exc:  # a bug or an OS error: still archive and record it
            self._stoppable = False
            status, secondary, reason = (
                JobStatus.Failed,
                SecondaryStatus.Failed,
                f"InternalError: {type(exc).__name__}: {exc}",
            )
        for timer in timers:
            timer.cancel()
        self._close_channels()
        # The space held back at the start is freed now: the job's end can be recorded even when the script
        # filled the disk (and an archive that fails for want of space is removed, freeing what it took).
        (self.job_dir / "hora" / RESERVE_NAME).unlink(missing_ok=True)
        try:
            self._status(JobStatus.InProgress, SecondaryStatus.Uploading, "archiving model/ and output/data")
        except StorageError as exc:
            self.say(f"could not record the Uploading status: {exc}")
        artifacts, upload_problem = archive(
            self.job_dir, [self.layouts[h] for h in self.hosts], self.spec.output_path, self.spec.job_name
        )
        if upload_problem and status is JobStatus.Completed:
            status, secondary = JobStatus.Failed, SecondaryStatus.Failed
            reason = f"ClientError: the script succeeded (every rank exited 0), but {upload_problem}"
        elif upload_problem:
            reason = f"{reason}\n(also: {upload_problem})"
        self.store.update(name, ended=time.time(), failure_reason=reason, exit_code=exit_code, artifacts=artifacts)
        self._status(status, secondary, (reason or "").splitlines()[0] if reason else "")
        self.store.save_record(name)  # the job's story outlives a lost index (hora job reindex)

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == spot.INTERRUPT_SIGNAL:  # a simulated spot reclaim: the ranks get SIGTERM, the job restarts
            host = spot.read_interrupt(self.job_dir)
            if self._reclaimed is None and self._stop_ranks():
                self._reclaimed = host
                self.say(f"spot capacity reclaimed ({host}): SIGTERM to every rank, SIGKILL after "
                         f"stop_grace={self.spec.stop_grace:g}s")
            else:
                self.say(f"a reclaim of {host} while no rank runs: nothing to interrupt")
            return
        if self._trees.forward(signum):  # the ranks run: the master's hora run stops them
            return
        if self._stoppable:
            raise _Stop(signum)
        self.say(f"{signal.Signals(signum).name} while archiving: finishing the archive first")

    def _stop_ranks(self) -> bool:
        """SIGTERM to every rank of the running attempt (SIGKILL after stop_grace); False when none runs."""
        if self._remote is None:
            return self._trees.forward(signal.SIGTERM)
        if not self._remote_running:
            return False
        os.kill(os.getpid(), signal.SIGTERM)  # hora run's launch() runs here: it stops every host's ranks
        return True

    def _max_run_reached(self) -> None:
        self._limit_reached("max_run", self.spec.max_run)

    def _max_wait_reached(self) -> None:
        self._limit_reached("max_wait", self.spec.max_wait or 0.0)

    def _limit_reached(self, limit: str, seconds: float) -> None:
        self._limit = limit
        self.store.transition(self.spec.job_name, JobStatus.InProgress, SecondaryStatus.Stopping,
                              f"{limit}={seconds:g}s reached")
        os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread: by launch() while ranks run, else _Stop

    def _stopped_reason(self, result: RunResult | None) -> tuple[JobStatus, SecondaryStatus, str]:
        if self._limit == "max_wait":
            return (JobStatus.Stopped, SecondaryStatus.MaxWaitTimeExceeded,
                    f"MaxWaitTimeExceeded: the job, with its waits for spot capacity, took longer than "
                    f"max_wait={self.spec.max_wait:g}s and was stopped")
        if self._limit == "max_run":
            return (JobStatus.Stopped, SecondaryStatus.MaxRuntimeExceeded,
                    f"MaxRuntimeExceeded: the job ran longer than max_run={self.spec.max_run:g}s and was stopped "
                    f"(SIGTERM, then SIGKILL after stop_grace={self.spec.stop_grace:g}s)")
        if self.store.get(self.spec.job_name).stop_requested:
            return JobStatus.Stopped, SecondaryStatus.Stopped, "stopped by request (hora job stop)"
        return JobStatus.Stopped, SecondaryStatus.Stopped, "interrupted by a signal to the job's supervisor"

    # -- phases ----------------------------------------------------------------------------------------------
    def _setup_network(self) -> None:
        """The hosts' addresses: a network namespace each where the spec allows and this user can, else loopback
        addresses (cluster.py)."""
        mode = resolve_network(self.spec.network)
        if mode == "namespace":
            for name in netns.sweep():
                self.say(f"removed {name}, left behind by a job supervisor that is gone")
            try:
                self._net = netns.create(len(self.hosts))
            except HoraError as exc:
                if self.spec.network == "namespace":
                    raise
                self.say(f"cannot create network namespaces ({exc}); the hosts use loopback addresses instead")
        if self._net is not None:
            self.addresses, self.interface = self._net.addresses, netns.INTERFACE
            self.say(f"hosts on network namespaces {', '.join(self._net.namespaces)} "
                     f"({', '.join(self.addresses)}, bridge {self._net.bridge})")
        else:
            self.addresses, self.interface = host_addresses(len(self.hosts)), LOOPBACK_INTERFACE
            self.say(f"hosts on loopback addresses {', '.join(self.addresses)}")

    def _setup_hosts(self) -> None:
        if self._remote is not None:
            remote = self._remote
            remote.probe()
            self.addresses, self.interface = [i["address"] for i in remote.info], remote.info[0]["interface"]
        else:
            self._setup_network()
        cpus, gpus = os.cpu_count() or 1, num_gpus()
        for index, host in enumerate(self.hosts):
            layout = self.layouts[host]
            info = self._remote.info[index] if self._remote is not None else {}
            write_host_config(self.spec, layout, host, info.get("interface", self.interface))
            # symlinks stay links: a link in the source dir never copies what it points to (a whole /etc)
            shutil.copytree(self.spec.source_dir, layout.code_dir, symlinks=True, dirs_exist_ok=True,
                            ignore=self._ignore_in_source)
            env = sm_environment(self.spec, layout, host, info.get("cpus", cpus), info.get("gpus", gpus))
            if info:  # the host's tree is at the same place under its job directory there
                env = {k: v.replace(str(self.job_dir), info["dir"]) for k, v in env.items()}
            # the spec's environment
            write_private(self.job_dir / "hora" / f"env-{host}.json", json.dumps(env, indent=1))
        self.say(f"hosts {', '.join(self.hosts)} set up under {self.job_dir / 'hosts'}")

    def _write_plan(self) -> None:
        """What every process of the job needs (:class:`~hora.jobs.plan.JobPlan`): the hosts, their addresses, the
        command, the hora run settings, the parameter servers, the metric definitions."""
        python = str(self._env.python) if self._env.exists else sys.executable
        python = self._remote.python if self._remote is not None else python
        user_hps = json.loads(self.job_dir.joinpath("hora", f"env-{self.hosts[0]}.json").read_text())["SM_HPS"]
        millis = self.spec.system_monitor_interval_millis
        plan = JobPlan(
            job_name=self.spec.job_name,
            home=str(self.store.home) if self._remote is None else "",  # remote: metrics parsed here (JobLines)
            hosts=tuple(self.hosts),
            addresses=tuple(self.addresses),
            network="ssh" if self._remote is not None else "namespace" if self._net is not None else "loopback",
            namespaces=tuple(self._net.namespaces) if self._net is not None else (),
            interface=self.interface,
            master_timeout=self.spec.master_timeout,
            connect_timeout=HOST_START_SECONDS,
            grace=self.spec.stop_grace,
            run_settings=unattended_settings(self.spec.run_settings, self._launch_env(1)),
            mpi_exports=dict(self.spec.mpi_exports),
            processes_per_host=self.spec.processes_per_host,
            command=tuple(entry_command(self.spec, to_cmd_args(json.loads(user_hps)), python)),
            python=python,
            strategy=self.spec.strategy,
            parameter_server=self._parameter_servers(),
            metric_definitions=self.spec.metric_definitions,
            echo=self.echo or self._remote is not None,  # remote: the lines come home through hora run
            system_monitor_interval=None if millis is None else millis / 1000,
        )
        plan.write(self.job_dir)
        try:
            base_hosts = Path("/etc/hosts").read_text()
        except OSError:
            base_hosts = "127.0.0.1\tlocalhost\n"
        (self.job_dir / "hora" / "hosts").write_text(hosts_file_text(base_hosts, self.addresses))

    def _parameter_servers(self) -> ParameterServerPlan | None:
        """The parameter_server distribution's tasks and their addresses (parameter_server.py), said once."""
        entry = parameter_server.plan_entry(self.spec.strategy, self.spec.ps_servers, self.hosts, self.addresses,
                                            namespaces=self._net is not None, remote=self._remote is not None)
        if self.spec.strategy != "parameter_server":
            return None
        if entry is not None and entry.servers == "hora":
            self.say(f"distribution parameter_server: one worker and one hora parameter server (hora.ps) per host "
                     f"on {len(self.hosts)} host(s); the script connects with hora.ps.connect()")
        elif entry is None:
            self.say("distribution parameter_server on one host: no parameter server and no TF_CONFIG, as "
                     "SageMaker's TensorFlow container (it enables the distribution from two hosts on)")
        else:
            self.say(f"distribution parameter_server: one worker and one TensorFlow parameter server per host; "
                     f"master/worker tasks at {', '.join(entry.worker_addresses)}, "
                     f"ps tasks at {', '.join(entry.ps_addresses)}")
        return entry

    def _ignore_in_source(self, directory: str, names: list[str]) -> list[str]:
        """Not copied into code/: caches, and the job store itself when it lies inside the source dir (it would
        copy itself forever)."""
        skip = {str(self.store.home.resolve())}
        if self.spec.output_path and not self.spec.output_path.startswith("s3://"):
            skip.add(self.spec.output_path)
        return [n for n in names
                if n == "__pycache__" or n.endswith(".pyc") or os.path.join(os.path.realpath(directory), n) in skip]

    def _stage_inputs(self) -> None:
        # on remote hosts each host fetches the s3:// channels itself (remote_hosts.py), after the push
        by_host = [ch for ch in self.spec.inputs if self._remote is not None and ch.is_s3 and ch.input_mode == "File"]
        for index, host in enumerate(self.hosts):
            layout = self.layouts[host]
            for ch in self.spec.inputs:
                if ch.input_mode == "File" and ch not in by_host:  # Pipe channels: afresh per attempt (_stage_pipes)
                    self.say(f"{host}: channel {ch.name!r} ({ch.input_mode}, {ch.distribution}) from {ch.uri}")
                    self._closers.append(_stage.stage_channel(ch, layout.data_dir, index, len(self.hosts), self.say))
            if self.spec.checkpoint_path:
                self._synced[host] = _stage.restore_checkpoints(self.spec.checkpoint_path, layout.checkpoint_dir)
        if self._remote is not None:
            ship_pipe_sources(self.spec.inputs, [self.layouts[h].root for h in self.hosts])
            self._remote.push(self.job_dir)
            self._remote.stage_s3(by_host, self._launch_env(1))

    def _stage_pipes(self) -> None:
        pipes = [ch for ch in self.spec.inputs if ch.input_mode == "Pipe"]
        if self._remote is not None:  # fed on each host (remote_hosts.py)
            if pipes:
                self._closers.append(self._remote.feed_pipes(pipes, self._launch_env(1)))
            return
        for index, host in enumerate(self.hosts):
            for ch in self.spec.inputs:
                if ch.input_mode == "Pipe":
                    self.say(f"{host}: channel {ch.name!r} (Pipe, {ch.distribution}) from {ch.uri}")
                    data_dir = self.layouts[host].data_dir
                    self._closers.append(_stage.stage_channel(ch, data_dir, index, len(self.hosts), self.say))

    def _close_channels(self) -> None:
        closers, self._closers = self._closers, []
        for closer in closers:
            try:
                closer.close()
            except Exception as exc:
                self.say(f"closing a channel failed: {exc}")
            if closer.error is not None:  # a Pipe feeder that failed mid-stream (the script saw it as an error)
                self.say(f"channel {closer.name!r}: {closer.error}")

    def _launch_env(self, attempt: int) -> dict[str, str]:
        env = environment()
        env.update(self.spec.environment)
        import hora  # the ranks import the same hora as this supervisor

        paths = [str(Path(hora.__file__).resolve().parent.parent)]
        if self._env.exists:  # the job's environment comes first, for `python` in shell scripts too
            env["PATH"] = os.pathsep.join([str(self._env.python.parent), env.get("PATH", os.defpath)])
            env["VIRTUAL_ENV"] = str(self._env.dir)
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["HORA_JOB_ATTEMPT"] = str(attempt)
        return env

def layouts_of(record: JobRecord) -> dict[str, HostLayout]:
    count = int(record.spec.get("instance_count", 1))
    return {h: host_layout(record.job_dir, h) for h in host_names(count)}
