"""Starting, watching and stopping the worker processes of one job on this machine.

Each worker runs in its own session (process group), so the launcher can signal a worker together with anything it
started, and a terminal's Ctrl-C reaches the launcher only; the launcher forwards SIGINT/SIGTERM to every group,
escalates to SIGKILL after a grace period, and never leaves a process behind. Workers also get PR_SET_PDEATHSIG,
so they are killed even if the launcher itself is SIGKILLed.

When a worker fails, the launcher stops the others within ``grace`` seconds and reports the *first* failure as the
root cause: a rank that was killed, or that failed for a reason of its own, before the ranks that only reacted to
losing it.

Ranks on remote hosts (``-H``/``--hostfile`` names that are not this machine) are started through one SSH session
per host running the hora agent (:mod:`hora.runner.remote`); the launcher checks every such host first and fails
fast, naming the host, when one cannot be used. Local "hosts" (this machine's names, 127.x addresses) are started
directly, each group with its own HORA_HOSTNAME and bind address.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousServer
from hora._transport.shm import sweep
from hora.config import Config
from hora.errors import ConfigError
from hora.runner.hosts import HostSlots, RankSlot, assign_ranks, is_local_host
from hora.runner.output import OutputPump
from hora.runner.remote import RemoteHost, RemoteRank
from hora.runner.ssh import SshOptions, advertise_address, preflight, remote_agent_command, ssh_command

__all__ = ["Failure", "LaunchSpec", "RunResult", "launch"]

_PR_SET_PDEATHSIG = 1
_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def _child_setup() -> None:  # runs in the forked child before exec: keep it tiny
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class LaunchSpec:
    command: Sequence[str]
    np: int
    hostname: str = "localhost"
    env: Mapping[str, str] | None = None
    settings: Mapping[str, object] = field(default_factory=dict)
    output_filename: str | None = None
    capture: bool = False
    prefix_output: bool = True
    verbose: bool = False
    grace: float = 3.0
    timeout: float | None = None
    cwd: str | None = None
    rendezvous_port: int = 0
    hosts: Sequence[HostSlots] | None = None  # None: every rank on this machine, as ``hostname``
    ssh: SshOptions | None = None
    network_interface: str | None = None
    start_timeout: float = 30.0
    local_hosts: Sequence[str] = ()  # host names that are this machine whatever they resolve to (hora job's algo-1)


@dataclass
class Failure:
    rank: int
    host: str
    pid: int
    returncode: int
    tail: list[str]
    when: float
    stopped: bool = False  # hora run's own stop signal ended it
    reason: str = ""  # why, when the rank's host failed rather than the rank (a lost SSH connection, say)

    @property
    def exit_code(self) -> int:
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def describe(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"killed by {name}"
        return f"exit code {self.returncode}"


@dataclass
class RunResult:
    """What a job ended with. ``exit_code`` is 0, or the root cause's exit code (128+N for signal N)."""

    exit_code: int
    returncodes: list[int | None]
    root_cause: Failure | None = None
    failures: list[Failure] = field(default_factory=list)
    interrupted: int | None = None
    timed_out: bool = False
    lines: dict[int, dict[str, list[str]]] = field(default_factory=dict)
    job_id: str = ""

    def report(self) -> str:
        """A human-readable account of the failure (empty when the job succeeded)."""
        if self.timed_out:
            head = "hora run: the job exceeded its time limit; every rank's stack was dumped to its stderr and the ranks were killed."
        elif self.interrupted is not None:
            head = f"hora run: interrupted by {signal.Signals(self.interrupted).name}; stopped every rank."
        elif self.root_cause is None:
            return ""
        else:
            head = (
                f"hora run: rank {self.root_cause.rank} failed first (the root cause, below); "
                "the other ranks were stopped."
            )
        lines = ["=" * 78, head]
        rc = self.root_cause
        if rc is not None:
            lines += [
                f"  rank  : {rc.rank}",
                f"  host  : {rc.host}",
                f"  pid   : {rc.pid}",
                f"  exit  : {rc.describe()}",
            ]
            if rc.reason:
                lines.append(f"  why   : {rc.reason}")
            if rc.tail:
                lines.append("  last stderr lines:")
                lines += [f"    {t}" for t in rc.tail[-12:]]
        lines.append(f"  {'rank':>4}  {'pid':>7}  outcome")
        for r, code in enumerate(self.returncodes):
            f = next((x for x in self.failures if x.rank == r), None)
            if f is None:
                outcome = "still running" if code is None else f"exit code {code}"
            elif f is rc:
                outcome = f"{f.describe()}   <- root cause"
            elif f.stopped and f.returncode in (-signal.SIGTERM, -signal.SIGKILL, -signal.SIGINT):
                outcome = f"stopped by hora run ({f.describe()})"
            elif f.reason:
                outcome = f"{f.describe()} — {f.reason[:120]}"
            else:
                outcome = f.describe() + (f" — {f.tail[-1][:100]}" if f.tail else "")
            lines.append(f"  {r:>4}  {f.pid if f else '':>7}  {outcome}")
        lines.append("=" * 78)
        return "\n".join(lines)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def worker_env(
    spec: LaunchSpec,
    rank: int,
    rdv: tuple[str, int],
    secret: bytes,
    job_id: str,
    master_port: int,
    slot: RankSlot | None = None,
    master_addr: str = "127.0.0.1",
    bind_addr: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Everything a worker gets: hora's variables, torchrun's names and Horovod's, plus the settings.

    ``slot`` places the rank (default: every rank on one host); ``base`` replaces the launcher's environment (for
    remote ranks, the part of it that is forwarded).
    """
    env = dict(base if base is not None else os.environ if spec.env is None else spec.env)
    n = spec.np
    if slot is None:
        slot = RankSlot(rank, spec.hostname, rank, n, 0, 1)
    topo = {
        "RANK": rank,
        "SIZE": n,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_SIZE": slot.local_size,
        "CROSS_RANK": slot.cross_rank,
        "CROSS_SIZE": slot.cross_size,
    }
    for k, v in topo.items():
        env[f"HORA_{k}"] = str(v)
        env[f"HOROVOD_{k}"] = str(v)
    env["HORA_HOSTNAME"] = env["HOROVOD_HOSTNAME"] = slot.host
    if bind_addr:
        env["HORA_BIND_ADDR"] = bind_addr
    env.update(
        HORA_RENDEZVOUS_ADDR=rdv[0],
        HORA_RENDEZVOUS_PORT=str(rdv[1]),
        HORA_SECRET=secret.hex(),
        HORA_JOB_ID=job_id,
        RANK=str(rank),
        WORLD_SIZE=str(n),
        LOCAL_RANK=str(slot.local_rank),
        LOCAL_WORLD_SIZE=str(slot.local_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        PYTHONUNBUFFERED="1",
    )
    env.update(Config.env_for(spec.settings))
    return env


class _LocalRank:
    """A rank started on this machine: the worker process, and its session."""

    reason = ""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the worker's own group: it and whatever it started
        except (ProcessLookupError, PermissionError):
            pass

    def reaped(self) -> None:
        # Whatever is left of its process group goes too (a shell's children, say).
        self.signal(signal.SIGKILL)


class _Job:
    def __init__(self, spec: LaunchSpec, slots: list[RankSlot]) -> None:
        self.spec = spec
        self.slots = slots
        self.procs: list[_LocalRank | RemoteRank] = []
        self.returncodes: list[int | None] = [None] * spec.np
        self.sent: list[int | None] = [None] * spec.np  # the last stopping signal hora run sent each rank
        self.failures: list[Failure] = []
        self.interrupted: int | None = None
        self.stopping_at: float | None = None
        self.first_failure_at: float | None = None
        self.pump = OutputPump(spec.output_filename, capture=spec.capture, prefix=spec.prefix_output)

    def log(self, message: str) -> None:
        if self.spec.verbose:
            print(f"hora run: {message}", file=sys.stderr, flush=True)

    def signal_all(self, sig: int) -> None:
        remote: dict[RemoteHost, list[int]] = {}
        for i, p in enumerate(self.procs):
            if self.returncodes[i] is None:
                if sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
                    self.sent[i] = sig
                if isinstance(p, RemoteRank):
                    remote.setdefault(p.host, []).append(i)  # one message per host, not per rank
                else:
                    p.signal(sig)
        for host, ranks in remote.items():
            host.signal(sig, ranks)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()
            self.log(f"stopping the remaining ranks with {signal.Signals(sig).name}")
            self.signal_all(sig)

    def reap(self, order: list[int]) -> bool:
        """Collect exited workers, in the order they exited where known; True when all have exited."""
        now = time.monotonic()
        round_failures = []
        for i in order + [i for i in range(len(self.procs)) if i not in order]:
            p = self.procs[i]
            if self.returncodes[i] is not None:
                continue
            code = p.poll()
            if code is None:
                continue
            self.returncodes[i] = code
            p.reaped()
            self.log(f"rank {i} (pid {p.pid} on {self.slots[i].host}) exited with {code}")
            if code != 0:
                stopped = code < 0 and self.sent[i] is not None and -code in (self.sent[i], signal.SIGKILL)
                round_failures.append(
                    Failure(i, self.slots[i].host, p.pid, code, [], now, stopped and not p.reason, p.reason)
                )
        self.failures.extend(round_failures)
        if self.first_failure_at is None and any(not f.stopped for f in round_failures):
            self.first_failure_at = now
        return all(c is not None for c in self.returncodes)


_FOLLOWER_ERRORS = ("PeerLostError", "ShutdownError")
#: After the first failure, the others get this long to exit on their own before hora run stops them: the rank
#: that failed first may still be finishing its own exit while its peers already react to its departure.
SETTLE = 0.5
ROOT_CAUSE_WINDOW = 1.0


def _root_cause(failures: list[Failure]) -> Failure | None:
    """The failure that started it all.

    Exit order alone misleads: the kernel closes a dying process's sockets before its parent hears of the death,
    so a peer that reacts at once can be reaped first. Among the failures within a second of the first one (and
    not caused by hora run's own stop signals), prefer a rank killed by a signal, then one whose last error is not
    hora's reaction to losing a peer (PeerLostError, ShutdownError), then the earliest.
    """
    own = [f for f in failures if not f.stopped]
    if not own:
        return None
    first = min(f.when for f in own)

    def key(f: Failure) -> tuple[int, float]:
        last = next((t for t in reversed(f.tail) if t.strip()), "")
        follower = any(e in last for e in _FOLLOWER_ERRORS)
        return (0 if f.returncode < 0 else 2 if follower else 1, f.when)

    return min((f for f in own if f.when - first <= ROOT_CAUSE_WINDOW), key=key)


class _ExitWatcher:
    """Reports which workers exited, in exit order: one pidfd per worker (Linux >= 5.3), polling elsewhere."""

    def __init__(self, procs: dict[int, int]) -> None:
        """``procs``: rank -> pid of each local worker (remote ranks are reported by their host's agent)."""
        self._sel: selectors.BaseSelector | None = None
        if hasattr(os, "pidfd_open"):
            try:
                sel = selectors.DefaultSelector()
                for i, pid in procs.items():
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, i)
                self._sel = sel
            except OSError:
                self._sel = None

    def wait(self, timeout: float) -> list[int]:
        if self._sel is None:
            time.sleep(timeout)
            return []
        order = []
        for key, _ in self._sel.select(timeout):
            order.append(key.data)
            self._sel.unregister(key.fd)
            os.close(key.fd)
        return order

    def close(self) -> None:
        if self._sel is not None:
            for key in list(self._sel.get_map().values()):
                os.close(key.fd)
            self._sel.close()


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


def _plan(spec: LaunchSpec) -> _Plan:
    """Place the ranks, check the remote hosts, and choose the addresses everything binds and advertises."""
    if spec.hosts:
        slots = assign_ranks(spec.np, list(spec.hosts))
    else:
        slots = [RankSlot(r, spec.hostname, r, spec.np, 0, 1) for r in range(spec.np)]
    hosts = list(dict.fromkeys(s.host for s in slots))
    remote = [h for h in hosts if h not in spec.local_hosts and not is_local_host(h)]
    if remote:
        ssh = spec.ssh or SshOptions()
        seen = preflight(remote, ssh)
        rdv_host = advertise_address(remote, spec.network_interface, seen)
        bind: dict[str, str | None] = {h: rdv_host for h in hosts if h not in remote}
    elif spec.network_interface:
        rdv_host = advertise_address([], spec.network_interface, {})
        bind = {h: rdv_host for h in hosts}
    else:
        rdv_host = "127.0.0.1"
        # Several loopback "hosts" (-H 127.0.0.2:2,127.0.0.3:2): each group binds its own address.
        bind = {h: (h if _is_ip(h) and len(hosts) > 1 else None) for h in hosts}
    first = slots[0].host
    master = first if first in remote else (rdv_host if remote else bind.get(first) or "127.0.0.1")
    return _Plan(slots, remote, rdv_host, bind, master)


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
    plan = _plan(spec)
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
    job = _Job(spec, plan.slots)
    master_port = _free_port()
    previous: dict[int, object] = {}
    hosts: list[RemoteHost] = []
    base_env = dict(os.environ if spec.env is None else spec.env)

    def on_signal(signum: int, frame: object) -> None:
        if job.interrupted is None:
            job.interrupted = signum
            job.stop(signum)
        else:  # a second Ctrl-C: no more patience
            job.signal_all(signal.SIGKILL)

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, on_signal)
    timed_out = False
    exits: _ExitWatcher | None = None
    try:
        handles: dict[int, _LocalRank | RemoteRank] = {}
        local_pids: dict[int, int] = {}
        for slot in plan.slots:
            if slot.host in plan.remote_hosts:
                continue
            env = worker_env(
                spec,
                slot.rank,
                rdv,
                secret,
                job_id,
                master_port,
                slot,
                plan.master_addr,
                plan.bind[slot.host],
            )
            proc = subprocess.Popen(
                list(spec.command),
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_child_setup,
            )
            handles[slot.rank] = _LocalRank(proc)
            local_pids[slot.rank] = proc.pid
            job.pump.add(slot.rank, proc.stdout, proc.stderr)  # type: ignore[arg-type]
            job.log(f"started rank {slot.rank} as pid {proc.pid}: {' '.join(spec.command)}")
        forwarded = forwarded_env(base_env)
        paths = [_hora_path(), *forwarded.get("PYTHONPATH", "").split(os.pathsep)]
        agent_path = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        for name in plan.remote_hosts:
            ranks: list[dict[str, Any]] = []
            for slot in plan.slots:
                if slot.host == name:
                    env = worker_env(
                        spec,
                        slot.rank,
                        rdv,
                        secret,
                        job_id,
                        master_port,
                        slot,
                        plan.master_addr,
                        None,
                        forwarded,
                    )
                    ranks.append(
                        {"rank": slot.rank, "env": {k: v for k, v in env.items() if forwarded.get(k) != v}}
                    )
            description = {
                "command": list(spec.command),
                "cwd": os.path.abspath(spec.cwd or os.getcwd()),
                "env": forwarded,
                "ranks": ranks,
                "grace": spec.grace,
                "network_interface": spec.network_interface,
            }
            argv = ssh_command(
                name, spec.ssh or SshOptions(), remote_agent_command(sys.executable, agent_path)
            )
            host = RemoteHost(
                name,
                [r["rank"] for r in ranks],
                argv,
                description,
                job.pump,
                spec.start_timeout + 10.0,
                _child_setup,
                echo_stderr=not spec.capture,
            )
            host.start()
            hosts.append(host)
            handles.update(host.ranks)
            job.log(
                f"started the hora agent on {name} for ranks {[r['rank'] for r in ranks]}: {' '.join(argv)}"
            )
        job.procs = [handles[r] for r in range(spec.np)]
        server.start()
        job.pump.start()
        for host in hosts:
            host.start_threads()
        exits = _ExitWatcher(local_pids)
        deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
        while not job.reap(exits.wait(0.05)):
            now = time.monotonic()
            for host in hosts:
                host.check(now)
            if deadline is not None and now > deadline and not timed_out:
                timed_out = True
                job.log("time limit reached: dumping stacks (SIGUSR1) and killing every rank")
                job.signal_all(signal.SIGUSR1)
                time.sleep(1.0)
                job.stop(signal.SIGKILL)
            if job.first_failure_at is not None and now - job.first_failure_at >= SETTLE:
                job.stop()
            if job.stopping_at is not None and now - job.stopping_at > spec.grace:
                job.signal_all(signal.SIGKILL)
    except BaseException:
        job.signal_all(signal.SIGKILL)
        for p in job.procs:
            if isinstance(p, _LocalRank):
                p.proc.wait()
        raise
    finally:
        if exits is not None:
            exits.close()
        for host in hosts:  # the agents stop whatever still runs there, then end their sessions
            host.close(timeout=spec.grace + 5.0)
        if in_main:
            for signum, handler in previous.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
        server.shutdown()
        for name in sweep(job_id):
            job.log(f"removed shared memory {name} that a crashed rank left behind")
    job.pump.join(timeout=5.0)
    for f in job.failures:
        f.tail = list(job.pump.tails.get(f.rank, []))
    root = _root_cause(job.failures)
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
    )
