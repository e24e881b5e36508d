"""Each rank of a job starts here (``python -m hora.jobs._entry JOB_DIR``), under ``hora run``, inside its host's
process tree (:mod:`hora.jobs._host`), whose namespaces it inherits.

It finds its host from its rank (ranks fill hosts in order), gives the script that host's ``SM_*`` variables and
hora's per-host rank variables, starts the entry point as its child in the wrapper's own process group (so hora
run's SIGTERM to the group reaches the script directly, and SIGKILL after the grace period takes both), and pumps the
script's output: every line is tagged ``[algo-2 rank 3]``, appended to the host's log file, matched against the
metric definitions (values go to the job store) and echoed to hora run. When the script ends it records the
script's real exit status and stderr tail for the supervisor, and ends the same way (same exit code, or the same
signal), so hora run's root-cause logic sees the script's outcome. On a remote host (``--remote``) the first rank's
wrapper also samples the host's system metrics and echoes them home (:mod:`hora.jobs.metric_lines`).

With the ``parameter_server`` distribution (:mod:`hora.jobs.parameter_server`) the wrapper is also what SageMaker's
TensorFlow container is on its host: it gives the script ``TF_CONFIG``, starts the host's TensorFlow
parameter-server task beside it (:class:`_PsTask`), keeps that task until the master's script has ended (on the
other hosts), and stops it. A parameter server that ends on its own while the job runs stops the script, and the
wrapper records and ends with the server's outcome, so the job's failure reason names it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hora._proc import die_with_parent
from hora.config.launchers import detect
from hora.config.variables import environment, read
from hora.config.worker_env import JobExtras, JobKeys, worker_env
from hora.errors import HoraError
from hora.jobs.metric_lines import FLUSH_SECONDS, MetricParser, system_metrics_line
from hora.jobs.outcome import describe_code
from hora.jobs.parameter_server import MasterWatch, ps_command, tf_config_for
from hora.jobs.plan import JobPlan
from hora.jobs.records import RankEnd, log_line, stderr_line
from hora.runner.system_metrics import SystemSampler

TAIL_LINES = 60
DRAIN_SECONDS = 5.0
#: How long a script gets to end after SIGTERM (its host's parameter server died) before SIGKILL.
SCRIPT_GRACE = 5.0
POLL_SECONDS = 0.2


def rank_env(base: dict[str, str], plan: JobPlan, host_env: dict[str, str], rank: int) -> dict[str, str]:
    """The script's environment: the launcher's, the host's SM_* set, and the worker contract written again
    (:func:`hora.config.worker_env.worker_env`) with this host's addresses and hora job's variables."""
    host = plan.host_of_rank(rank)
    index, pph = plan.host_index(host), plan.processes_per_host
    tree = Path(host_env["SM_MODEL_DIR"]).parent
    keys = JobKeys.from_env(base)  # what hora run drew for the whole job: kept as it is
    return worker_env(
        {**base, **host_env},
        rank=rank,
        size=plan.world_size,
        local_rank=rank % pph,
        local_size=pph,
        cross_rank=index,
        cross_size=len(plan.hosts),
        host=host,
        rendezvous=keys.rendezvous,
        secret=keys.secret,
        job_id=keys.job_id,
        master_addr=plan.addresses[0],
        master_port=keys.master_port,
        bind_addr=plan.addresses[index],
        # SAGEMAKER_BASE_DIR: where SageMaker's training toolkit (sagemaker_training.environment) reads this host's
        # /opt/ml tree, so its Environment() agrees with the SM_* variables on every host, with or without the
        # /opt/ml mount; the exports are custom_mpi_options' -x, as mpirun exports them
        job=JobExtras(plan.job_name, str(tree), {k: on_host_tree(v, tree) for k, v in plan.mpi_exports.items()}),
    )


def on_host_tree(value: str, tree: Path) -> str:
    """``value`` with a leading ``/opt/ml`` replaced by this host's tree, where the host has no /opt/ml mount
    (not root): ``-x HOROVOD_TIMELINE=/opt/ml/output/data/timeline.json`` then still lands in the host's
    output/data."""
    if str(tree) == "/opt/ml" or not (value == "/opt/ml" or value.startswith("/opt/ml/")):
        return value
    return str(tree) + value[len("/opt/ml") :]


class _Pump:
    def __init__(self, plan: JobPlan, job_dir: Path, host: str, rank: int, attempt: int) -> None:
        self.tag = f"[{host} rank {rank}]"
        self.lock = threading.Lock()  # whole lines on this wrapper's stdout: the script's and the system sampler's
        self.host, self.rank, self.attempt = host, rank, attempt
        self.echo = plan.echo
        self.log_path = job_dir / "logs" / f"{host}.log"
        self.log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.log_failed = False
        # a job on remote hosts has no store here (plan.home is empty): its supervisor parses the lines it gets
        self.metrics = MetricParser(plan.metric_definitions, plan.home, plan.job_name)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)

    def line(self, stream: str, text: str) -> None:
        now = time.time()
        # One write per line with O_APPEND: lines of the host's ranks interleave but never tear.
        try:
            os.write(self.log_fd, log_line(self.tag, stream, text, now))
        except OSError as exc:  # a full disk: the script goes on; say so once, on the wrapper's own stderr
            if not self.log_failed:
                self.log_failed = True
                stderr_line(f"{self.tag} hora job: cannot write {self.log_path} ({exc.strerror}); this rank's "
                            "lines are missing from it from here on")
        if stream == "stderr":
            self.tail.append(text)
        if self.echo:
            self.echo_line(stream, f"{self.tag} {text}")
        self.metrics.feed(text, self.host, self.rank, self.attempt, now, self.tag)

    def echo_line(self, stream: str, line: str) -> None:
        target = sys.stdout if stream == "stdout" else sys.stderr
        with self.lock:
            try:
                target.write(line + "\n")
                target.flush()
            except (BrokenPipeError, ValueError):
                pass

    def flush(self) -> None:
        self.metrics.flush(self.tag)


def _pump(proc: subprocess.Popen[bytes], pump: _Pump) -> None:
    sel = selectors.DefaultSelector()
    partial: dict[str, bytes] = {}
    streams: list[tuple[str, IO[bytes] | None]] = [("stdout", proc.stdout), ("stderr", proc.stderr)]
    for name, pipe in streams:
        assert pipe is not None
        sel.register(pipe, selectors.EVENT_READ, name)
        partial[name] = b""
    open_pipes = 2
    drain_until = None
    while open_pipes:
        if drain_until is None and proc.poll() is not None:
            # The script has ended; something it started may still hold its stdout open. Read what is there,
            # but do not wait for such a leftover forever.
            drain_until = time.monotonic() + DRAIN_SECONDS
        elif drain_until is not None and time.monotonic() > drain_until:
            pump.line("stderr", f"hora job: the script exited but a process it started still holds its output "
                                f"open; stopped reading after {DRAIN_SECONDS:g}s")
            break
        for key, _ in sel.select(timeout=0.2 if drain_until else FLUSH_SECONDS):
            name = key.data
            try:
                data = os.read(key.fd, 65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                open_pipes -= 1
                if partial[name]:
                    pump.line(name, partial[name].decode(errors="replace"))
                continue
            *lines, partial[name] = (partial[name] + data).split(b"\n")
            for raw in lines:
                pump.line(name, raw.decode(errors="replace").rstrip("\r"))
        pump.metrics.flush_if_due(pump.tag)
    sel.close()


class _PsTask:
    """The host's TensorFlow parameter-server task (:mod:`hora.jobs._tf_ps`) beside the script: its output tagged
    ``[algo-K ps]`` into the host's log; an end that nobody asked for is noted (when, how, its stderr tail) and
    ``on_death`` is called."""

    def __init__(self, plan: JobPlan, job_dir: Path, host: str, rank: int, attempt: int, env: dict[str, str]) -> None:
        servers = plan.parameter_server
        if servers is None:
            raise HoraError(f"the plan of job {plan.job_name} runs no parameter servers; {host} has no ps task")
        index = plan.host_index(host)
        self.name = f"TensorFlow parameter server ps:{index} at {servers.ps_addresses[index]}"
        self.master_address = servers.ps_addresses[0]  # the master host's ps task
        self.pump = _Pump(plan, job_dir, host, rank, attempt)
        self.pump.tag = f"[{host} ps]"
        self.stopping = False
        self.died: float | None = None  # when it ended on its own
        self.code: int | None = None
        self.on_death: list[Callable[[], object]] = []
        self.proc = subprocess.Popen(
            ps_command(servers, plan.hosts, host, plan.python),
            cwd=job_dir / "hosts" / host,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,
            start_new_session=True,  # hora run's SIGTERM to the rank's group is for the script; the wrapper stops this
        )
        self.thread = threading.Thread(target=self._watch, name="hora-job-ps", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        _pump(self.proc, self.pump)
        self.code = self.proc.wait()
        if not self.stopping:
            self.died = time.time()
            self.pump.line("stderr", f"hora job: the {self.name} ended ({describe_code(self.code)}) while the job "
                                     "ran; stopping this host's script")
            for callback in self.on_death:
                callback()
        self.pump.flush()

    def stop(self) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(SCRIPT_GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(DRAIN_SECONDS + 1.0)


def _stop_script(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if the script is still there after SCRIPT_GRACE (from a timer: never blocks)."""
    if proc.poll() is not None:
        return
    proc.terminate()

    def kill() -> None:
        if proc.poll() is None:
            proc.kill()

    timer = threading.Timer(SCRIPT_GRACE, kill)
    timer.daemon = True
    timer.start()


def _remote_system_metrics(plan: JobPlan, host: str, rank: int, pump: _Pump) -> SystemSampler | None:
    """On a remote host, the first rank's wrapper samples the host (profiler_config) and echoes the batches home
    (the host has no job store; :func:`hora.jobs.metric_lines.system_metrics_line`). A job on this machine's hosts
    is sampled by each host's agent (:mod:`hora.jobs._host`)."""
    if plan.network != "ssh" or plan.system_monitor_interval is None or rank % plan.processes_per_host:
        return None
    try:
        return SystemSampler(plan.system_monitor_interval,
                             lambda batch: pump.echo_line("stdout", system_metrics_line(host, batch))).start()
    except (HoraError, OSError) as exc:
        pump.line("stderr", f"hora job: no system metrics for this host: {exc}")
        return None


def job_dir_of(argv: list[str], rank: int) -> Path:
    """``JOB_DIR``; for a job on remote hosts ``--remote TEMPLATE PROCESSES_PER_HOST HOST...``: the job's directory
    on this rank's host, ``{host}`` in it that host's name as the job lists it and ``~`` this host's home."""
    if argv[0] != "--remote":
        return Path(argv[0])
    host = argv[3 + rank // int(argv[2])]
    return Path(os.path.expanduser(argv[1].replace("{host}", host)))


def become_host(job_dir: Path, plan: JobPlan, host: str) -> None:
    """On a remote host, run as root: this wrapper (and its script) see algo-K names in /etc/hosts, the host name
    algo-K and the tree at /opt/ml, as a local job's hosts do (:func:`hora.jobs.cluster.enter_host`); in a private
    mount and UTS namespace, so the machine's own files are untouched. Without root nothing changes."""
    if os.geteuid() != 0:
        return
    from hora.jobs.cluster import enter_host, hosts_file_text

    try:
        base = Path("/etc/hosts").read_text()
    except OSError:
        base = "127.0.0.1\tlocalhost\n"
    path = job_dir / "hora" / f"hosts-{host}"
    partial = path.with_name(f".{path.name}.{os.getpid()}")  # the host's ranks write it at once: each its own
    partial.write_text(hosts_file_text(base, list(plan.addresses)))
    os.replace(partial, path)
    enter_host(host, path, job_dir / "hosts" / host)


def main() -> None:
    rank = detect().rank
    job_dir = job_dir_of(sys.argv[1:], rank)
    plan = JobPlan.read(job_dir)
    attempt = int(read("HORA_JOB_ATTEMPT") or "1")
    host = plan.host_of_rank(rank)
    if plan.network == "ssh":  # before any thread starts
        become_host(job_dir, plan, host)
    host_env = json.loads((job_dir / "hora" / f"env-{host}.json").read_text())
    env = rank_env(environment(), plan, host_env, rank)
    tf_config = tf_config_for(plan.parameter_server, plan.hosts, host)
    # The script ends itself on SIGTERM (hora run signals the whole group); this wrapper keeps pumping its output
    # until it has gone, and dies with it on SIGKILL.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pump = _Pump(plan, job_dir, host, rank, attempt)
    sampler = _remote_system_metrics(plan, host, rank, pump)
    # parameter_server: the host's ps task first, then the script, as SageMaker's container (_run_ps, _run_worker)
    ps = _PsTask(plan, job_dir, host, rank, attempt, env) if tf_config is not None else None
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    try:
        proc = subprocess.Popen(
            list(plan.command),
            cwd=job_dir / "hosts" / host / "code",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,  # the script dies with this wrapper, even one SIGKILLed alone
        )
    except OSError as exc:
        pump.line("stderr", f"hora job: cannot start {plan.command[0]!r}: {exc.strerror}")
        code = 127
        pid = 0
    else:
        pid = proc.pid
        if ps is not None:
            ps.on_death.append(lambda: _stop_script(proc))
            if ps.died is not None:  # it died before the callback was there
                _stop_script(proc)
        _pump(proc, pump)
        code = proc.wait()
    pump.flush()
    if sampler is not None:
        sampler.stop()  # the last sample, and what is pending, home before this wrapper ends
    end = RankEnd(rank, host, pid, code, tuple(pump.tail), time.time())
    if ps is not None:
        if code == 0 and host != plan.hosts[0]:  # a worker host keeps its ps task until the master's script ends
            master = MasterWatch(job_dir, attempt, ps.master_address)
            while not (stop.is_set() or ps.died is not None or master.ended()):
                time.sleep(POLL_SECONDS)
        ps.stop()
        if ps.died is not None:  # the job's failure is the parameter server's
            code = ps.code if ps.code else 1
            end = RankEnd(rank, host, ps.proc.pid, code, tuple(ps.pump.tail), ps.died, ps_task=ps.name)
    try:
        end.write(job_dir, attempt)
    except OSError as exc:  # the exit code still reaches hora run; only the traceback tail is lost
        stderr_line(f"{pump.tag} hora job: cannot record this rank's end in {job_dir / 'hora'}: {exc}")
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:  # die of the same signal, so hora run reports the script's outcome unchanged
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset (EINVAL)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
