"""One host of a job: ``python -m hora.jobs._host JOB_DIR HOST ATTEMPT``, started by the job's supervisor.

The process takes on the host's identity first (its network namespace, then a private mount and UTS namespace with
the job's ``/etc/hosts`` and the host name ``algo-K``; see :mod:`hora.jobs.cluster`), so every process of the host
descends from it and lives in the host's namespaces. Then:

- **every host** samples its CPU, memory, network and disks into the job store while it runs (``profiler_config``;
  :mod:`hora.runner.system_metrics`), in a daemon thread stopped, with a last sample, when the host ends.
- **algo-1, the master**, starts every rank of every host with hora run (:func:`hora.runner.launch.launch`): its
  own ranks locally, the other hosts' through their agents, reached with :mod:`hora.jobs._rsh` in place of ssh.
  It writes hora run's outcome to ``hora/attempt-N/master.json`` and exits with hora run's exit code.
- **the other hosts** listen on a Unix socket (:func:`socket_path`) and wait for the master, as a SageMaker
  worker waits for the master's SSH: each connection authenticates with the attempt's secret (challenge-response,
  before anything else is read), then passes a shell command and its stdin/stdout/stderr (SCM_RIGHTS), which the
  agent runs in a session of its own and whose exit status it sends back; a client that goes away takes its
  session with it. The agent ends when the master's job session has ended (with that session's exit code), on
  SIGTERM (stopping its sessions), or — when the master never started the ranks within ``master_timeout`` — with
  a report in ``hora/attempt-N/host-algo-K.json`` and exit code 3.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hora._orphans import end_adopted
from hora._proc import become_subreaper, die_with_parent
from hora._runtime.auth import Role, server_handshake
from hora._runtime.gate import RejectLog
from hora._wire import recv_exact, send_frame
from hora.config.variables import environment
from hora.errors import HoraError
from hora.jobs.cluster import read_secret, socket_path
from hora.jobs.parameter_server import launch_settings
from hora.jobs.plan import JobPlan
from hora.jobs.records import HostReport, MasterRecord, host_says
from hora.jobs.store import JobStore
from hora.runner.system_metrics import Sample, SystemSampler

__all__ = ["MASTER_NEVER_CAME", "main"]

#: The exit code of a host whose master never started the ranks.
MASTER_NEVER_CAME = 3
MAX_REQUEST = 1 << 20
HANDSHAKE_SECONDS = 10.0
JOB_SESSION_MARK = "hora.runner.host_agent"  # the master's session that runs this host's ranks


# -- the other hosts --------------------------------------------------------------------------------------------
class _Session:
    """One command run for the master: the client's fds, a session of its own, the exit status sent back."""

    def __init__(self, conn: socket.socket, env: dict[str, str], cwd: str) -> None:
        self.conn = conn
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.is_job = False
        self.code: int | None = None

    def serve(self, secret: bytes, host: str, on_start: Any, rejects: RejectLog) -> None:
        fds: list[int] = []
        try:
            server_handshake(self.conn, secret, HANDSHAKE_SECONDS, roles=(Role.AGENT,))
            self.conn.settimeout(HANDSHAKE_SECONDS)
            data, fds, _, _ = socket.recv_fds(self.conn, 8 + 65536, 3)
            if len(data) < 8 or len(fds) != 3:
                raise HoraError("a request without its length or its three file descriptors")
            length = int.from_bytes(data[:8], "big")
            if length > MAX_REQUEST:
                raise HoraError(f"a request of {length} bytes (at most {MAX_REQUEST})")
            body = data[8:]
            if len(body) < length:
                body += recv_exact(self.conn, length - len(body), "the master")
            request = json.loads(body[:length])
            command = str(request["command"])
            self.is_job = JOB_SESSION_MARK in command
            self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                         env=self.env, cwd=self.cwd, start_new_session=True,
                                         preexec_fn=die_with_parent)
        except (HoraError, OSError, ValueError, KeyError) as exc:
            rejects.drop(exc)
            self.conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        on_start(self)
        self.conn.settimeout(None)
        while self.proc.poll() is None:
            readable, _, _ = select.select([self.conn], [], [], 0.2)
            if readable:
                try:
                    gone = self.conn.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                if gone:  # the client went away (the master's launcher killed it): end what it started
                    self.stop(grace=2.0)
                    break
        self.code = self.proc.wait()
        try:
            send_frame(self.conn, json.dumps({"exit": self.code}).encode())
        except OSError:
            pass
        self.conn.close()

    def stop(self, grace: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def serve(job_dir: Path, plan: JobPlan, host: str, attempt: int) -> int:
    """Wait for the master and run what it asks until its job session ends (see the module docstring)."""
    secret = read_secret(job_dir)
    path = socket_path(job_dir, host)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    listener.listen(16)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    sessions: list[_Session] = []
    job_done = threading.Event()
    job_started = threading.Event()
    env = environment()
    env["SSH_CONNECTION"] = f"{plan.addresses[0]} 0 {plan.addresses[plan.host_index(host)]} 22"
    cwd = str(job_dir / "hosts" / host)

    def on_start(session: _Session) -> None:
        if session.is_job:
            job_started.set()

    rejects = RejectLog(logging.getLogger(__name__), "refused a connection", say=lambda m: host_says(host, m))

    def run(session: _Session) -> None:
        session.serve(secret, host, on_start, rejects)
        if session.is_job:
            job_done.set()

    deadline = time.monotonic() + plan.master_timeout
    try:
        while not job_done.is_set() and not stopping.is_set():
            if not job_started.is_set() and time.monotonic() > deadline:
                master = plan.hosts[0]
                reason = (f"{host} waited {plan.master_timeout:g}s for the master host {master} to start the "
                          f"ranks and it never did (see {master}'s messages above or in logs/job.log); "
                          "raise master_timeout in the job spec if the master is just slow to start")
                host_says(host, reason)
                HostReport(host, reason).write(job_dir, attempt)
                return MASTER_NEVER_CAME
            readable, _, _ = select.select([listener], [], [], 0.2)
            if readable:
                conn, _ = listener.accept()
                session = _Session(conn, env, cwd)
                sessions.append(session)
                threading.Thread(target=run, args=(session,), name=f"hora-host-{host}", daemon=True).start()
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        for session in sessions:
            session.stop(grace=plan.grace)
    if stopping.is_set():
        return 128 + signal.SIGTERM
    job = [s for s in sessions if s.is_job]
    code = job[-1].code if job and job[-1].code is not None else 0
    return code if code >= 0 else 128 - code


# -- the master -------------------------------------------------------------------------------------------------
def run_master(job_dir: Path, plan: JobPlan, host: str, attempt: int) -> int:
    """Start every rank with hora run across the job's hosts; record its outcome for the supervisor."""
    from hora.runner.hosts import HostSlots
    from hora.runner.launch import LaunchSpec, launch
    from hora.runner.ssh import SshOptions

    rsh = [sys.executable, "-m", "hora.jobs._rsh", str(job_dir)]
    try:
        settings = launch_settings(plan)
    except HoraError as exc:
        host_says(host, str(exc))
        MasterRecord(error=f"{type(exc).__name__}: {exc}").write(job_dir, attempt)
        return 1
    spec = LaunchSpec(
        [sys.executable, "-m", "hora.jobs._entry", str(job_dir)],
        plan.world_size,
        env=environment(),
        settings=settings,
        prefix_output=False,
        grace=plan.grace,
        cwd=str(job_dir),
        hosts=[HostSlots(h, plan.processes_per_host) for h in plan.hosts],
        ssh=SshOptions(agent=rsh, connect_timeout=plan.connect_timeout),
        network_interface=plan.interface,
        local_hosts=(host,),
    )
    try:
        result = launch(spec)
    except HoraError as exc:
        host_says(host, f"hora run could not start the ranks: {exc}")
        MasterRecord(error=f"{type(exc).__name__}: {exc}").write(job_dir, attempt)
        return 1
    try:
        MasterRecord(result=result).write(job_dir, attempt)
    except OSError as exc:  # a full disk: the supervisor reports the missing record; say why here
        host_says(host, f"cannot record how hora run ended in {job_dir / 'hora'}: {exc}")
    return result.exit_code


def _system_metrics(plan: JobPlan, host: str) -> SystemSampler | None:
    """Sample this host (in its own network namespace) into the job store while it runs (profiler_config)."""
    if plan.system_monitor_interval is None:
        return None
    store = JobStore(plan.home)

    def sink(batch: list[Sample]) -> None:
        store.add_system_metrics(plan.job_name, [(host, t, name, value) for t, name, value in batch])

    try:
        return SystemSampler(plan.system_monitor_interval, sink).start()
    except (HoraError, OSError) as exc:
        host_says(host, f"no system metrics for this host: {exc}")
        return None


def main() -> None:
    job_dir, host, attempt = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    plan = JobPlan.read(job_dir)
    index = plan.host_index(host)
    if plan.network == "namespace":
        from hora.jobs import netns

        netns.enter(plan.namespaces[index])
    from hora.jobs.cluster import enter_host

    # algo-K resolves, is the host name, and its tree is /opt/ml (as root; see cluster.py)
    enter_host(host, job_dir / "hora" / "hosts", job_dir / "hosts" / host)
    become_subreaper()  # what the scripts double-fork is this host's to end with the job
    sampler = _system_metrics(plan, host)
    try:
        code = run_master(job_dir, plan, host, attempt) if index == 0 else serve(job_dir, plan, host, attempt)
    finally:
        if sampler is not None:
            sampler.stop()  # the last sample, and what is still pending, into the store
    left = end_adopted()
    if left:
        print(f"hora job: {host}: ended {len(left)} process(es) the job's scripts left running: {', '.join(left)}",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
