"""Running one job: set up the hosts, install the code, stage the data, launch the ranks, judge the outcome, and
archive the artifacts — even when the job fails or is stopped.

The supervisor (:class:`JobRunner`) plays SageMaker's part: it builds the hosts (directories, addresses, network
namespaces where it can), stages the data, then starts one process tree per host (:mod:`hora.jobs._host`) for
each attempt. The master host, algo-1, starts every rank of every host with hora run; the other hosts wait for it
(and report when it never comes); each rank's wrapper (:mod:`hora.jobs._entry`) tags its output. States:
``InProgress`` (secondary ``Starting`` → ``Downloading`` → ``Training`` → ``Uploading``) then ``Completed``,
``Failed`` or ``Stopped`` (secondary ``Stopped`` or ``MaxRuntimeExceeded``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hora._proc import process_start_time
from hora._runtime.auth import new_secret
from hora.errors import HoraError, HostStartError
from hora.jobs import _stage, channels, netns
from hora.jobs.channels import ChannelHandle
from hora.jobs.cluster import (
    LOOPBACK_INTERFACE,
    host_addresses,
    host_index_of_rank,
    host_names,
    hosts_file_text,
    record_attempt,
    resolve_network,
    runtime_dir,
    socket_path,
)
from hora.jobs.contract import (
    HostLayout,
    host_layout,
    num_gpus,
    sm_environment,
    to_cmd_args,
    write_host_config,
)
from hora.jobs.spec import JobSpec
from hora.jobs.store import JobRecord, JobStore
from hora.runner.launch import Failure, RunResult, _child_setup, _root_cause

__all__ = ["JobRunner", "entry_command", "failure_reason"]

TRACEBACK_LINES = 15
#: How long the supervisor waits for each non-master host's agent to listen before starting the master anyway
#: (the master's connections retry for as long again).
HOST_START_SECONDS = 30.0


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


def _traceback_tail(lines: list[str]) -> list[str]:
    """The last traceback in a rank's stderr (at most the last lines of it), else its last lines."""
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), default=None)
    chosen = lines[start:] if start is not None else lines
    return chosen[-TRACEBACK_LINES:]


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {128 - code})"
    return f"exit code {code}"


def failure_reason(job_dir: Path, hosts: list[str], processes_per_host: int, attempt: int,
                   result: RunResult) -> tuple[str, int | None]:
    """(reason, exit code): a failure file written by the script wins; else the first failing host and rank, its
    real exit code and the tail of its traceback."""
    for host in hosts:
        f = host_layout(job_dir, host).failure_file
        if f.is_file():
            text = f.read_text(errors="replace").strip()
            if text:
                rc = result.root_cause
                code = rc.exit_code if rc is not None else result.exit_code
                return f"AlgorithmError: {host} wrote output/failure:\n{text[:4096]}", code
    statuses = {}
    for path in (job_dir / "hora" / f"attempt-{attempt}").glob("rank-*.json"):
        status = json.loads(path.read_text())
        statuses[status["rank"]] = status
    rc = _root_cause_with_tails(result, statuses)
    if rc is None:
        return f"AlgorithmError: the ranks ended with exit code {result.exit_code}", result.exit_code
    host = hosts[host_index_of_rank(rc.rank, processes_per_host)]
    status = statuses.get(rc.rank, {"tail": [], "returncode": rc.returncode, "pid": rc.pid})
    tail, code, pid = status["tail"], status["returncode"], status["pid"] or rc.pid
    lines = [f"AlgorithmError: host {host}, rank {rc.rank} (pid {pid}) failed first: {_describe_code(code)}"]
    tb = _traceback_tail(tail)
    if tb:
        lines.append("last lines of its stderr:")
        lines += [f"  {t}" for t in tb]
    return "\n".join(lines), (128 - code if code < 0 else code)


def _root_cause_with_tails(result: RunResult, statuses: dict[int, dict[str, Any]]) -> Failure | None:
    """hora run's root-cause choice, fed with what it cannot see here: each script's stderr tail and exit time
    (the wrappers record them), so a rank that only reacted to another's death (PeerLostError, ShutdownError)
    is not blamed."""
    if not all(f.rank in statuses for f in result.failures):  # exit times must all come from the same clock
        return result.root_cause
    return _root_cause([
        dataclasses.replace(f, tail=list(statuses[f.rank]["tail"]), when=float(statuses[f.rank]["ended"]))
        for f in result.failures
    ])


def _merge_tar(dirs: list[Path], archive: Path) -> None:
    """One .tar.gz of several hosts' directories; on a name clash the earlier host (algo-1 first) wins."""
    chosen: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.rglob("*")):
            if path.is_file() or path.is_symlink():
                chosen.setdefault(path.relative_to(d).as_posix(), path)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name, path in sorted(chosen.items()):
            tar.add(path, arcname=name, recursive=False)


def _run_in_own_group(cmd: list[str], cwd: Path, env: dict[str, str], log: Any, timeout: float) -> int:
    """Run ``cmd`` in its own process group and return its exit code; on a stop (an exception here, e.g. the
    max_run or ``hora job stop`` signal) or after ``timeout`` the whole group is killed: pip's build
    subprocesses go with it."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_child_setup)
    try:
        return proc.wait(timeout)
    except BaseException as exc:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise HoraError(f"{' '.join(cmd[:4])} ... took longer than {timeout:g}s") from None
        raise


class JobRunner:
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
        self._limit_hit = False
        self._stoppable = True
        self._closers: list[ChannelHandle] = []
        self._log_file: Any = None
        self._net: netns.HostNetwork | None = None
        self.addresses: list[str] = []
        self.interface = LOOPBACK_INTERFACE
        self._agents: dict[str, subprocess.Popen[bytes]] = {}
        self._interrupted: int | None = None

    # -- messages --------------------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        if self._log_file is not None:
            self._log_file.write(f"{stamp}Z {message}\n")
            self._log_file.flush()
        if self._progress is not None:
            self._progress(message)

    def _status(self, status: str, secondary: str, message: str = "") -> None:
        self.store.transition(self.spec.job_name, status, secondary, message)
        self.say(f"{status} / {secondary}" + (f": {message}" if message else ""))

    # -- the whole job ---------------------------------------------------------------------------------------
    def run(self) -> JobRecord:
        name = self.spec.job_name
        (self.job_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.job_dir / "hora").mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.job_dir / "logs" / "job.log", "a")  # noqa: SIM115 - closed below
        pid = os.getpid()
        (self.job_dir / "hora" / "supervisor.json").write_text(json.dumps({"pid": pid, "start": process_start_time(pid)}))
        start = time.time()
        self.store.update(name, started=start, supervisor_pid=pid)
        timer = threading.Timer(self.spec.max_run, self._max_run_reached)
        timer.daemon = True
        timer.start()
        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        if in_main:
            for s in (signal.SIGTERM, signal.SIGINT):
                previous[s] = signal.signal(s, self._on_signal)
        status, secondary, reason, exit_code = "Failed", "Failed", None, None
        try:
            try:
                self._status("InProgress", "Starting", f"{len(self.hosts)} host(s) x {self.spec.processes_per_host} process(es)")
                self._setup_hosts()
                self._install()
                self._write_plan()
                self._status("InProgress", "Downloading", "staging input channels")
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
                status, secondary, reason = "Failed", "Failed", f"HostError: {exc}"
            except HoraError as exc:
                self._stoppable = False
                status, secondary, reason = "Failed", "Failed", f"ClientError: {exc}"
            except Exception as exc:  # a bug or an OS error: still archive and record it
                self._stoppable = False
                status, secondary, reason = "Failed", "Failed", f"InternalError: {type(exc).__name__}: {exc}"
            timer.cancel()
            self._close_channels()
            self._status("InProgress", "Uploading", "archiving model/ and output/data")
            artifacts, upload_problem = self._archive()
            if upload_problem and status == "Completed":
                status, secondary, reason = "Failed", "Failed", upload_problem
            elif upload_problem:
                reason = f"{reason}\n(also: {upload_problem})"
            self.store.update(name, ended=time.time(), failure_reason=reason, exit_code=exit_code, artifacts=artifacts)
            self._status(status, secondary, (reason or "").splitlines()[0] if reason else "")
        finally:
            timer.cancel()
            self._stop_agents(signal.SIGKILL)
            if self._net is not None:
                self._net.remove()
                self._net = None
            shutil.rmtree(runtime_dir(self.job_dir), ignore_errors=True)
            if in_main:
                for s, h in previous.items():
                    signal.signal(s, h)
            self._log_file.close()
            self._log_file = None
        return self.store.get(name)

    def _on_signal(self, signum: int, frame: object) -> None:
        master = self._agents.get(self.hosts[0])
        if master is not None and master.poll() is None:  # the ranks run: the master's hora run stops them
            if self._interrupted is None:
                self._interrupted = signum
                master.send_signal(signum)
            else:  # a second signal: no more patience
                self._stop_agents(signal.SIGKILL)
            return
        if self._stoppable:
            raise _Stop(signum)
        self.say(f"{signal.Signals(signum).name} while archiving: finishing the archive first")

    def _max_run_reached(self) -> None:
        self._limit_hit = True
        self.store.transition(self.spec.job_name, "InProgress", "Stopping", f"max_run={self.spec.max_run:g}s reached")
        os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread: by launch() while ranks run, else _Stop

    def _stopped_reason(self, result: RunResult | None) -> tuple[str, str, str]:
        if self._limit_hit:
            return ("Stopped", "MaxRuntimeExceeded",
                    f"MaxRuntimeExceeded: the job ran longer than max_run={self.spec.max_run:g}s and was stopped "
                    f"(SIGTERM, then SIGKILL after stop_grace={self.spec.stop_grace:g}s)")
        if self.store.get(self.spec.job_name).stop_requested:
            return "Stopped", "Stopped", "stopped by request (hora job stop)"
        return "Stopped", "Stopped", "interrupted by a signal to the job's supervisor"

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
        self._setup_network()
        cpus, gpus = os.cpu_count() or 1, num_gpus()
        for host in self.hosts:
            layout = self.layouts[host]
            write_host_config(self.spec, layout, host, self.interface)
            shutil.copytree(self.spec.source_dir, layout.code_dir, dirs_exist_ok=True, ignore=self._ignore_in_source)
            env = sm_environment(self.spec, layout, host, cpus, gpus)
            (self.job_dir / "hora" / f"env-{host}.json").write_text(json.dumps(env, indent=1))
        self.say(f"hosts {', '.join(self.hosts)} set up under {self.job_dir / 'hosts'}")

    def _write_plan(self) -> None:
        """What every rank's wrapper needs: the hosts, their addresses, the command, the metric definitions."""
        python = str(self._env_python()) if self._env_python().exists() else sys.executable
        user_hps = json.loads(self.job_dir.joinpath("hora", f"env-{self.hosts[0]}.json").read_text())["SM_HPS"]
        plan = {
            "job_name": self.spec.job_name,
            "home": str(self.store.home),
            "hosts": self.hosts,
            "addresses": self.addresses,
            "network": "namespace" if self._net is not None else "loopback",
            "namespaces": self._net.namespaces if self._net is not None else [],
            "interface": self.interface,
            "master_timeout": self.spec.master_timeout,
            "connect_timeout": HOST_START_SECONDS,
            "grace": self.spec.stop_grace,
            "run_settings": self.spec.run_settings,
            "processes_per_host": self.spec.processes_per_host,
            "command": entry_command(self.spec, to_cmd_args(json.loads(user_hps)), python),
            "metric_definitions": [{"Name": m.name, "Regex": m.regex} for m in self.spec.metric_definitions],
            "echo": self.echo,
        }
        (self.job_dir / "hora" / "plan.json").write_text(json.dumps(plan, indent=1))
        try:
            base_hosts = Path("/etc/hosts").read_text()
        except OSError:
            base_hosts = "127.0.0.1\tlocalhost\n"
        (self.job_dir / "hora" / "hosts").write_text(hosts_file_text(base_hosts, self.addresses))

    def _ignore_in_source(self, directory: str, names: list[str]) -> list[str]:
        """Not copied into code/: caches, and the job store itself when it lies inside the source dir (it would
        copy itself forever)."""
        skip = {str(self.store.home.resolve())}
        if self.spec.output_path and not self.spec.output_path.startswith("s3://"):
            skip.add(self.spec.output_path)
        return [n for n in names
                if n == "__pycache__" or n.endswith(".pyc") or os.path.join(os.path.realpath(directory), n) in skip]

    def _env_dir(self) -> Path:
        return self.job_dir / "env"

    def _env_python(self) -> Path:
        return self._env_dir() / "bin" / "python"

    def _make_env(self) -> None:
        """A virtual environment for the job that sees every package this Python has (system site-packages, and
        the outer virtual environment's through a .pth file), so pip installs only what is missing."""
        venv = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(self._env_dir())]
        with open(self.job_dir / "logs" / "install.log", "ab") as log:
            if _run_in_own_group(venv, self.job_dir, dict(os.environ), log, 300) != 0:
                raise HoraError(f"cannot create the job's environment {self._env_dir()} (see logs/install.log)")
        if sys.prefix != sys.base_prefix:  # running inside a venv: its packages are not the "system" ones
            import site
            import sysconfig

            purelib = sysconfig.get_path("purelib", vars={"base": str(self._env_dir()),
                                                          "platbase": str(self._env_dir())})
            Path(purelib, "_hora_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    def _install(self) -> None:
        """requirements.txt, then a setup.py package, into the job's own environment: a virtual environment in
        the job directory that also sees this Python's packages, so what is already installed (torch, numpy)
        is not installed again. Its python runs the ranks' scripts. pip honours PIP_CONSTRAINT, PIP_INDEX_URL,
        PIP_NO_INDEX ... from the job's environment."""
        src = self.layouts[self.hosts[0]].code_dir
        steps = []
        if (src / "requirements.txt").is_file():
            steps.append(("requirements.txt", ["-r", "requirements.txt"]))
        if (src / "setup.py").is_file():
            steps.append(("the setup.py package", ["--no-build-isolation", "."]))
        if not steps:
            return
        self.say(f"creating the job's environment {self._env_dir()}")
        self._make_env()
        env = {**os.environ, **self.spec.environment}
        for what, args in steps:
            self.say(f"installing {what} into {self._env_dir()}")
            cmd = [sys.executable, "-m", "pip", "--python", str(self._env_python()), "install",
                   "--disable-pip-version-check", "--no-input", *args]
            with open(self.job_dir / "logs" / "install.log", "ab") as log:
                returncode = _run_in_own_group(cmd, src, env, log, self.spec.max_run)
            if returncode != 0:
                tail = (self.job_dir / "logs" / "install.log").read_text(errors="replace").strip().splitlines()[-8:]
                raise HoraError(f"installing {what} failed (pip exit code {returncode}):\n  " + "\n  ".join(tail))

    def _stage_inputs(self) -> None:
        for index, host in enumerate(self.hosts):
            layout = self.layouts[host]
            for ch in self.spec.inputs:
                if ch.input_mode == "File":  # Pipe channels are fed afresh for every attempt (_stage_pipes)
                    self.say(f"{host}: channel {ch.name!r} ({ch.input_mode}, {ch.distribution}) from {ch.uri}")
                    self._closers.append(_stage.stage_channel(ch, layout.data_dir, index, len(self.hosts), self.say))
            if self.spec.checkpoint_path:
                _stage.download_dir(self.spec.checkpoint_path, layout.checkpoint_dir)

    def _stage_pipes(self) -> None:
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
        env = dict(os.environ)
        env.update(self.spec.environment)
        import hora  # the ranks import the same hora as this supervisor

        paths = [str(Path(hora.__file__).resolve().parent.parent)]
        if self._env_python().exists():  # the job's environment comes first, for `python` in shell scripts too
            env["PATH"] = os.pathsep.join([str(self._env_python().parent), env.get("PATH", os.defpath)])
            env["VIRTUAL_ENV"] = str(self._env_dir())
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["HORA_JOB_ATTEMPT"] = str(attempt)
        return env

    def _fresh_attempt(self) -> None:
        """A retry starts like a new instance would: empty model/ and output/, but the checkpoints stay."""
        for layout in self.layouts.values():
            for d in (layout.model_dir, layout.output_dir):
                shutil.rmtree(d, ignore_errors=True)
            layout.create()

    def _train(self) -> tuple[str, str, str | None, int | None]:
        attempts = self.spec.max_retry_attempts + 1
        reason: str | None = None
        code: int | None = None
        for attempt in range(1, attempts + 1):
            self.store.update(self.spec.job_name, attempts=attempt)
            if attempt > 1:
                self._close_channels()  # the last attempt's Pipe feeders
                self._fresh_attempt()
            self._stage_pipes()
            self._status("InProgress", "Training", f"attempt {attempt} of {attempts}: "
                         f"{self.spec.world_size} rank(s) with hora run")
            result = self._run_hosts(attempt)
            self._sync_checkpoints_out()
            if result.interrupted is not None:
                status, secondary, why = self._stopped_reason(result)
                return status, secondary, why, result.exit_code
            if result.exit_code == 0:
                return "Completed", "Completed", None, 0
            reason, code = failure_reason(self.job_dir, self.hosts, self.spec.processes_per_host, attempt, result)
            if attempt < attempts:
                self.say(f"attempt {attempt} failed; retrying. {reason.splitlines()[0]}")
        return "Failed", "Failed", reason, code

    # -- the hosts' process trees ---------------------------------------------------------------------------
    def _start_agent(self, host: str, attempt: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "hora.jobs._host", str(self.job_dir), host, str(attempt)],
            cwd=self.job_dir, env=env, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C on the terminal reaches the supervisor only; it stops the hosts
            preexec_fn=_child_setup,  # the hosts die with their supervisor
        )

    def _stop_agents(self, sig: int) -> None:
        for proc in self._agents.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        if sig == signal.SIGKILL:
            for proc in self._agents.values():
                proc.wait()

    def _run_hosts(self, attempt: int) -> RunResult:
        """One attempt: start every host's process tree (the others first, then the master), wait for the master's
        hora run to end, let the other hosts finish, and read back hora run's outcome."""
        outcome = self.job_dir / "hora" / f"attempt-{attempt}"
        outcome.mkdir(parents=True, exist_ok=True)
        secret = self.job_dir / "hora" / "secret"
        secret.touch(mode=0o600)
        secret.write_text(new_secret().hex())  # a fresh secret per attempt: an old attempt's process cannot join
        runtime_dir(self.job_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        env = self._launch_env(attempt)
        self._interrupted = None
        self._agents = {}
        try:
            for host in self.hosts[1:]:
                self._agents[host] = self._start_agent(host, attempt, env)
            deadline = time.monotonic() + HOST_START_SECONDS
            for host in self.hosts[1:]:  # the master's first connections would only retry meanwhile
                while (not socket_path(self.job_dir, host).exists() and self._agents[host].poll() is None
                       and time.monotonic() < deadline and self._interrupted is None):
                    time.sleep(0.05)
            gone = {h: p.returncode for h, p in self._agents.items() if p.poll() is not None}
            if gone:  # the master would only wait for them in vain
                raise HostStartError("the job's hosts failed:\n  " + "\n  ".join(
                    f"{h}'s agent ended ({_describe_code(code)}) before the master started; see its messages "
                    "in the job's output (logs/supervisor.err for a detached job)" for h, code in gone.items()))
            master = self._start_agent(self.hosts[0], attempt, env)
            self._agents[self.hosts[0]] = master
            while master.poll() is None:
                time.sleep(0.1)
            # The other hosts end when the master's sessions with them close; give them the grace period to.
            deadline = time.monotonic() + self.spec.stop_grace + 10.0
            while any(p.poll() is None for p in self._agents.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
            stragglers = [h for h, p in self._agents.items() if p.poll() is None]
            if stragglers:
                self.say(f"host(s) {', '.join(stragglers)} still ran after the master ended; stopping them")
            self._stop_agents(signal.SIGTERM)
            time.sleep(0.5 if stragglers else 0)
            self._stop_agents(signal.SIGKILL)
            codes = {h: p.returncode for h, p in self._agents.items()}
        except BaseException:  # a stop before the master started, or a bug: no host may outlive it
            self._stop_agents(signal.SIGTERM)
            time.sleep(0.5)
            self._stop_agents(signal.SIGKILL)
            raise
        finally:
            self._agents = {}
        return self._master_result(attempt, codes)

    def _master_result(self, attempt: int, codes: dict[str, int]) -> RunResult:
        outcome = self.job_dir / "hora" / f"attempt-{attempt}"
        try:
            record = json.loads((outcome / "master.json").read_text())
        except (OSError, ValueError):
            record = {"error": f"the master host {self.hosts[0]} ended ({_describe_code(codes[self.hosts[0]])}) "
                               "without reporting how hora run ended; the ranks it had started were stopped"}
        if "error" in record:
            if self._interrupted is not None:
                return RunResult(128 + self._interrupted, [None] * self.spec.world_size, None, [],
                                 self._interrupted, False, {}, "")
            problems = [record["error"]]
            for host in self.hosts[1:]:
                try:
                    problems.append(json.loads((outcome / f"host-{host}.json").read_text())["error"])
                except (OSError, ValueError, KeyError):
                    if codes.get(host) not in (0, None):
                        problems.append(f"{host}'s agent ended with {_describe_code(codes[host])}")
            raise HostStartError("the job's hosts failed:\n  " + "\n  ".join(problems))
        failures = [Failure(**f) for f in record["failures"]]
        interrupted = record["interrupted"] if record["interrupted"] is not None else self._interrupted
        record_attempt(self.job_dir, attempt, "result",
                       {"returncodes": record["returncodes"], "exit_code": record["exit_code"], "interrupted": interrupted})
        return RunResult(record["exit_code"], record["returncodes"], _root_cause(failures), failures, interrupted,
                         record["timed_out"], {}, record["job_id"])

    def _sync_checkpoints_out(self) -> None:
        if self.spec.checkpoint_path:
            for layout in self.layouts.values():
                _stage.upload_dir(layout.checkpoint_dir, self.spec.checkpoint_path)

    def _archive(self) -> tuple[dict[str, str], str | None]:
        """model/ -> model.tar.gz and output/data -> output.tar.gz, written to ``<output_path>/<job>/output/``
        (the job's own ``output/`` without an output_path)."""
        staging = self.job_dir / "hora" / "archives"
        artifacts: dict[str, str] = {}
        try:
            _merge_tar([self.layouts[h].model_dir for h in self.hosts], staging / "model.tar.gz")
            _merge_tar([self.layouts[h].output_data_dir for h in self.hosts], staging / "output.tar.gz")
            dest = (f"{self.spec.output_path.rstrip('/')}/{self.spec.job_name}/output" if self.spec.output_path
                    else str(self.job_dir / "output"))
            for name in ("model.tar.gz", "output.tar.gz"):
                artifacts[name.split(".")[0]] = channels.upload(staging / name, dest)
        except (HoraError, OSError) as exc:
            return artifacts, f"ClientError: archiving the artifacts failed: {exc}"
        return artifacts, None


def layouts_of(record: JobRecord) -> dict[str, HostLayout]:
    count = int(record.spec.get("instance_count", 1))
    return {h: host_layout(record.job_dir, h) for h in host_names(count)}
