"""Starting, watching and stopping the worker processes of one job on this machine.

Each worker runs in its own session (process group), so the launcher can signal a worker together with anything it
started, and a terminal's Ctrl-C reaches the launcher only; the launcher forwards SIGINT/SIGTERM to every group,
escalates to SIGKILL after a grace period, and never leaves a process behind. Workers also get PR_SET_PDEATHSIG,
so they are killed even if the launcher itself is SIGKILLed.

When a worker fails, the launcher stops the others within ``grace`` seconds and reports the *first* failure as the
root cause: a rank that was killed, or that failed for a reason of its own, before the ranks that only reacted to
losing it.

Ranks on remote hosts (``-H``/``--hostfile`` names that are not this machine) are started through one SSH session
per host running the hora agent (:mod:`hora.runner.remote_host`); the launcher checks every such host first and fails
fast, naming the host, when one cannot be used. Local "hosts" (this machine's names, 127.x addresses) are started
directly, each group with its own HORA_HOSTNAME and bind address.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hora._proc import die_with_parent, handle_signals, usable_cpus
from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousServer
from hora._transport.shm import sweep
from hora.config import Config
from hora.config.variables import environment
from hora.config.worker_env import worker_env
from hora.errors import ConfigError
from hora.runner.contradictions import check_launch
from hora.runner.hosts import RankSlot, assign_ranks, is_local_host, place_servers
from hora.runner.launch_spec import LaunchSpec
from hora.runner.limits import check_process_count
from hora.runner.output import OutputPump
from hora.runner.ps_servers import PsServers, check_checkpoint_dir
from hora.runner.reaper import GroupReaper
from hora.runner.remote_host import RemoteHost, RemoteRank
from hora.runner.result import Failure, RunResult, root_cause
from hora.runner.ssh import SshOptions, advertise_address, preflight, remote_agent_command, ssh_command
from hora.runner.stacks import StackDumps
from hora.runner.supervise import SETTLE, ExitWatcher, JobProcesses, LocalRank
from hora.runner.system_metrics import SystemMetricsLog

__all__ = ["Failure", "LaunchSpec", "RunResult", "forwarded_env", "launch"]


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _worker_env(
    spec: LaunchSpec,
    slot: RankSlot,
    rdv: tuple[str, int],
    secret: bytes,
    job_id: str,
    master: tuple[str, int],
    bind_addr: str | None,
    base: Mapping[str, str],
    cpus: int | None = None,
) -> dict[str, str]:
    """Everything a worker gets (:func:`hora.config.worker_env.worker_env`), on top of ``base``; ``cpus``: the
    cores of the rank's host, for the thread defaults (None for a remote host, whose agent counts its own)."""
    return worker_env(
        base,
        rank=slot.rank,
        size=spec.np,
        local_rank=slot.local_rank,
        local_size=slot.local_size,
        cross_rank=slot.cross_rank,
        cross_size=slot.cross_size,
        host=slot.host,
        rendezvous=rdv,
        secret=secret,
        job_id=job_id,
        master_addr=master[0],
        master_port=master[1],
        bind_addr=bind_addr,
        settings=spec.settings,
        cpus=cpus,
    )


#: Variables of the launcher's environment that describe its own login session, not the job: remote ranks keep
#: their host's values. Everything else is forwarded, as horovodrun forwards its environment.
_NOT_FORWARDED = {
    "HOME", "HOSTNAME", "LOGNAME", "MAIL", "OLDPWD", "PWD", "SHELL", "SHLVL", "TERM", "USER", "DISPLAY", "_",
}  # fmt: skip
_NOT_FORWARDED_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_", "HORA_SECRET", "HORA_BIND_ADDR")


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that remote ranks get (PATH, PYTHONPATH, HORA_*, HOROVOD_*, ...)."""
    return {
        k: v for k, v in env.items() if k not in _NOT_FORWARDED and not k.startswith(_NOT_FORWARDED_PREFIXES)
    }


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


@dataclass
class _Plan:
    slots: list[RankSlot]
    remote_hosts: list[str]
    rdv_host: str
    bind: dict[str, str | None]  # local host name -> the address its ranks bind (None: hora's default)
    master_addr: str
    ps_hosts: list[str]  # the host of each parameter server (--num-ps / --ps-per-host)


def _plan(spec: LaunchSpec, base_env: Mapping[str, str]) -> _Plan:
    """Place the ranks and the parameter servers, check the remote hosts, and choose the addresses everything binds
    and advertises."""
    if spec.hosts:
        slots = assign_ranks(spec.np, list(spec.hosts))
    else:
        slots = [RankSlot(r, spec.hostname, r, spec.np, 0, 1) for r in range(spec.np)]
    hosts = list(dict.fromkeys(s.host for s in slots))
    ps_hosts = _server_hosts(spec, hosts, base_env)  # a bad combination fails before any SSH check
    known = spec.host_addresses  # names the network does not know: never this machine's, never resolved
    remote = [h for h in hosts
              if spec.remote_only or h in known or (h not in spec.local_hosts and not is_local_host(h))]
    here = sum(s.host not in remote for s in slots) + sum(h not in remote for h in ps_hosts)
    servers = f" with {len(ps_hosts)} parameter server(s)" if ps_hosts else ""
    check_process_count(here, f"-np {spec.np}{servers}", spec.oversubscribe)
    if remote:
        ssh = spec.ssh or SshOptions()
        seen = preflight(remote, ssh)
        rdv_host = advertise_address(remote, spec.network_interface, seen, known)
        bind: dict[str, str | None] = {h: rdv_host for h in hosts if h not in remote}
    elif spec.network_interface:
        rdv_host = advertise_address([], spec.network_interface, {})
        bind = {h: rdv_host for h in hosts}
    else:
        rdv_host = "127.0.0.1"
        # Several loopback "hosts" (-H 127.0.0.2:2,127.0.0.3:2): each group binds its own address.
        bind = {h: (h if _is_ip(h) and len(hosts) > 1 else None) for h in hosts}
    first = slots[0].host
    master = known.get(first, first) if first in remote else (rdv_host if remote else bind.get(first) or "127.0.0.1")
    return _Plan(slots, remote, rdv_host, bind, master, ps_hosts)


def _hora_path() -> str:
    """The directory hora is imported from here, so the remote agent imports the same hora (same paths)."""
    import hora

    return os.path.dirname(os.path.dirname(os.path.abspath(hora.__file__)))


def launch(spec: LaunchSpec) -> RunResult:
    """Run ``spec.command`` as ``spec.np`` ranks on this machine and the hosts of ``spec.hosts``, and wait for them.

    Raises:
        HostError: a remote host failed the SSH check (nothing was started).
        ConfigError: the rendezvous cannot listen, or ``--network-interface`` names no usable interface.
    """
    base_env = dict(environment() if spec.env is None else spec.env)
    plan = _plan(spec, base_env)
    ps_hosts = plan.ps_hosts
    if ps_hosts:  # the workers wait for every server, wherever it runs (--ps-per-host gives only a count per host)
        spec = dataclasses.replace(spec, settings={**spec.settings, "num_ps": len(ps_hosts)})
    secret = new_secret()
    job_id = uuid.uuid4().hex[:16]
    server = RendezvousServer(secret, host=plan.rdv_host, port=spec.rendezvous_port)
    try:
        rdv = server.bind()
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {plan.rdv_host}:{spec.rendezvous_port} for the rendezvous: {exc.strerror}. "
            "Choose another --rendezvous-port, or leave it out to use a free port."
        ) from None
    pump = OutputPump(spec.output_filename, capture=spec.capture, prefix=spec.prefix_output, quiet=spec.quiet)
    job = JobProcesses(plan.slots, pump, spec.verbose)
    job.pump.observer = spec.observer
    if spec.observer is not None:
        spec.observer.started([(slot.rank, slot.host) for slot in plan.slots])
    master = (plan.master_addr, _free_port())
    hosts: list[RemoteHost] = []

    def on_signal(signum: int, frame: object) -> None:
        if job.interrupted is None:
            job.interrupted = signum
            job.stop(signum)
        else:  # a second Ctrl-C: no more patience
            job.signal_all(signal.SIGKILL)

    timed_out = False
    exits: ExitWatcher | None = None
    try:
        servers = _parameter_servers(spec, plan, ps_hosts, base_env, rdv, secret, job_id, master, job)
        sampled = SystemMetricsLog.open(spec.system_metrics, spec.system_metrics_interval)  # this host, from now
    except BaseException:
        server.shutdown()
        raise
    reaper = GroupReaper()  # ends the ranks' process groups should this process be killed
    stacks = StackDumps(job_id)  # where the local ranks dump their stacks when asked
    reaper.remove_on_death(str(stacks.directory))
    handles: dict[int, LocalRank | RemoteRank] = {}
    with handle_signals(on_signal, signal.SIGINT, signal.SIGTERM):
        try:
            for slot in plan.slots:
                if job.interrupted is not None:  # Ctrl-C or SIGTERM while starting: start nothing more
                    raise _StartInterrupted
                if slot.host not in plan.remote_hosts:
                    env = _worker_env(
                        spec, slot, rdv, secret, job_id, master, plan.bind[slot.host], base_env, usable_cpus()
                    )
                    env["HORA_STACKS_DIR"] = str(stacks.directory)
                    handles[slot.rank] = _start_local(spec, slot, env, job)
                    reaper.add(handles[slot.rank].pid)
            forwarded = forwarded_env(base_env)
            for name in plan.remote_hosts:
                if job.interrupted is not None:
                    raise _StartInterrupted
                host = _start_remote(spec, name, plan, ps_hosts, rdv, secret, job_id, master, forwarded, job)
                host.on_system = sampled.write if sampled else None
                hosts.append(host)
                handles.update(host.ranks)
            job.procs = [handles[r] for r in range(spec.np)]
            if job.interrupted is not None:
                raise _StartInterrupted
            if servers is not None:
                servers.on_start = reaper.add
                for pid in servers.start(spec.cwd):
                    reaper.add(pid)
            server.start()
            job.pump.start()
            for host in hosts:
                host.start_threads()
            exits = ExitWatcher({r: h.pid for r, h in handles.items() if isinstance(h, LocalRank)})
            timed_out = _supervise(spec, job, hosts, exits, servers, stacks)
        except _StartInterrupted:  # what started goes the way a stopped job's ranks go: the signal, then SIGKILL
            assert job.interrupted is not None
            _end_started([h for h in handles.values() if isinstance(h, LocalRank)], job.interrupted, spec.grace)
            if servers is not None:
                servers.stop(spec.grace)
        except BaseException:
            for h in handles.values():
                if isinstance(h, LocalRank):
                    h.signal(signal.SIGKILL)
            if servers is not None:
                servers.stop(0.0)
            for h in handles.values():
                if isinstance(h, LocalRank):
                    h.proc.wait()
            raise
        finally:
            if exits is not None:
                exits.close()
            for host in hosts:  # the agents stop whatever still runs there, then end their sessions
                host.close(timeout=spec.grace + 5.0)
            if servers is not None:  # the workers are done: the servers go too
                servers.stop(spec.grace)
            reaper.close()
            server.shutdown()
            if sampled is not None:  # after the hosts' sessions: their last samples are in
                sampled.close()
            for name in sweep(job_id):
                job.log(f"removed shared memory {name} that a crashed rank left behind")
            saved = stacks.save(spec.output_filename, keep=not spec.capture)
    job.pump.join(timeout=5.0)
    for f in job.failures:
        f.tail = list(job.pump.tails.get(f.rank, []))
    # a parameter server that died while the workers ran (not restarted) is a failure too: usually the first
    server_failures = (servers.failures if servers is not None else []) + [f for h in hosts for f in h.server_failures]
    root = root_cause(job.failures + server_failures)
    if timed_out:
        exit_code = 124
    elif job.interrupted is not None:
        exit_code = 128 + job.interrupted
    else:
        exit_code = root.exit_code if root else 0
    return RunResult(
        exit_code,
        job.returncodes,
        root,
        job.failures,
        job.interrupted,
        timed_out,
        job.pump.lines if spec.capture else {},
        job_id,
        stacks=stacks.captured,
        stacks_saved=saved,
    )


class _StartInterrupted(Exception):
    """A signal came while the job's processes were being started."""


def _end_started(ranks: list[LocalRank], sig: int, grace: float) -> None:
    """``sig`` to the ranks started so far, SIGKILL to those still running after ``grace`` seconds."""
    for r in ranks:
        r.signal(sig)
    end = time.monotonic() + grace
    while any(r.poll() is None for r in ranks) and time.monotonic() < end:
        time.sleep(0.02)
    for r in ranks:
        if r.poll() is None:
            r.signal(signal.SIGKILL)
        r.proc.wait()


def _start_local(spec: LaunchSpec, slot: RankSlot, env: dict[str, str], job: JobProcesses) -> LocalRank:
    proc = subprocess.Popen(
        list(spec.command),
        env=env,
        cwd=spec.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if spec.merge_stderr else subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    job.pump.add(slot.rank, proc.stdout, proc.stderr)  # type: ignore[arg-type]
    job.log(f"started rank {slot.rank} as pid {proc.pid}: {' '.join(spec.command)}")
    return LocalRank(proc)


def _start_remote(
    spec: LaunchSpec,
    name: str,
    plan: _Plan,
    ps_hosts: list[str],
    rdv: tuple[str, int],
    secret: bytes,
    job_id: str,
    master: tuple[str, int],
    forwarded: dict[str, str],
    job: JobProcesses,
) -> RemoteHost:
    """Start the agent of remote host ``name`` over SSH; it starts the host's ranks and parameter servers."""
    paths = [_hora_path(), *forwarded.get("PYTHONPATH", "").split(os.pathsep)]
    agent_path = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    ranks: list[dict[str, Any]] = []
    for slot in plan.slots:
        if slot.host == name:
            env = _worker_env(spec, slot, rdv, secret, job_id, master, None, forwarded)
            ranks.append({"rank": slot.rank, "env": {k: v for k, v in env.items() if forwarded.get(k) != v}})
    # Its servers get the environment of its first rank (the store, the secret, HORA_HOSTNAME): servers are not
    # ranks, and read only the job's variables.
    servers = [{"index": i, "env": ranks[0]["env"]} for i, h in enumerate(ps_hosts) if h == name]
    description = {
        "command": list(spec.command),
        "cwd": os.path.abspath(spec.cwd or os.getcwd()),
        "env": forwarded,
        "ranks": ranks,
        "servers": servers,
        "workers": spec.np,
        "grace": spec.grace,
        "network_interface": spec.network_interface,
        "merge_stderr": spec.merge_stderr,
        "system_metrics_interval": spec.system_metrics_interval if spec.system_metrics else None,
    }
    ssh = spec.ssh or SshOptions()
    argv = ssh_command(name, ssh, remote_agent_command(ssh.python or sys.executable, agent_path))
    host = RemoteHost(
        name,
        [r["rank"] for r in ranks],
        argv,
        description,
        job.pump,
        spec.start_timeout + 10.0,
        die_with_parent,
        echo_stderr=not spec.capture,
        servers=[s["index"] for s in servers],
    )
    host.start()
    also = f" and parameter servers {host.servers}" if servers else ""
    job.log(f"started the hora agent on {name} for ranks {[r['rank'] for r in ranks]}{also}: {' '.join(argv)}")
    return host


def _server_hosts(spec: LaunchSpec, hosts: list[str], base_env: Mapping[str, str]) -> list[str]:
    """The host of each of the job's parameter servers (``--num-ps`` / ``--ps-per-host``); [] when it has none.

    Raises:
        ConfigError: ``--num-ps`` and ``--ps-per-host`` disagree, or the settings contradict each other
            (:func:`hora.runner.contradictions.check_launch`).
    """
    try:
        config = Config.resolve(env=base_env, overrides=spec.settings)
    except ConfigError:
        return []  # the workers report the bad setting themselves
    check_launch(config, spec.settings)
    return place_servers(config.num_ps, config.ps_per_host, hosts)


def _parameter_servers(
    spec: LaunchSpec,
    plan: _Plan,
    ps_hosts: list[str],
    base_env: Mapping[str, str],
    rdv: tuple[str, int],
    secret: bytes,
    job_id: str,
    master: tuple[str, int],
    job: JobProcesses,
) -> PsServers | None:
    """The job's parameter servers on this machine, not started yet (the remote hosts' agents start theirs); None
    when the job has none. Each gets the environment of its host's first rank, so it binds its host's address."""
    if not ps_hosts:
        return None
    config = Config.resolve(env=base_env, overrides=spec.settings)
    max_restarts = config.ps_max_restarts  # remote hosts: their agents'
    first: dict[str, RankSlot] = {}
    for slot in plan.slots:
        first.setdefault(slot.host, slot)
    local = {
        i: _worker_env(spec, first[h], rdv, secret, job_id, master, plan.bind[h], base_env, usable_cpus())
        for i, h in enumerate(ps_hosts)
        if h not in plan.remote_hosts
    }
    if local and config.ps_checkpoint_dir:  # found out now, not when the first checkpoint fails mid-job
        check_checkpoint_dir(config.ps_checkpoint_dir)
    return PsServers(
        len(ps_hosts), spec.np, {}, job.pump, job.log, max_restarts, local=local, merge_stderr=spec.merge_stderr
    )


def _supervise(
    spec: LaunchSpec,
    job: JobProcesses,
    hosts: list[RemoteHost],
    exits: ExitWatcher,
    servers: PsServers | None = None,
    stacks: StackDumps | None = None,
) -> bool:
    """Wait for every rank, stopping the others after the first failure and at the time limit (their stacks taken
    first); True when the time limit was reached."""
    timed_out = False
    deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
    while not job.reap(exits.wait(0.05)):
        if servers is not None:
            servers.check()
        now = time.monotonic()
        for host in hosts:
            host.check(now)
        if deadline is not None and now > deadline and not timed_out:
            timed_out = True
            job.log("time limit reached: taking every rank's stacks and killing every rank")
            _take_stacks(job, stacks)
            job.stop(signal.SIGKILL)
        if job.first_failure_at is not None and now - job.first_failure_at >= SETTLE and job.stopping_at is None:
            _take_stacks(job, stacks)
            job.stop()
        if job.stopping_at is not None and now - job.stopping_at > spec.grace:
            job.signal_all(signal.SIGKILL)
    return timed_out


def _take_stacks(job: JobProcesses, stacks: StackDumps | None) -> None:
    """The stacks of the ranks still running, here and (through their hosts' agents) on remote hosts."""
    if stacks is None:
        return
    running = [(r, p) for r, p in enumerate(job.procs) if job.returncodes[r] is None]
    local = {r: p.pid for r, p in running if isinstance(p, LocalRank)}
    got = stacks.capture(local, remote={r: p.host for r, p in running if isinstance(p, RemoteRank)})
    if got:
        job.log(f"took the stacks of ranks {sorted(got)}")
