"""Starting, watching and stopping the worker processes of one job on this machine.

Each worker runs in its own session (process group), so the launcher can signal a worker together with anything it
started, and a terminal's Ctrl-C reaches the launcher only; the launcher forwards SIGINT/SIGTERM to every group,
escalates to SIGKILL after a grace period, and never leaves a process behind. Workers also get PR_SET_PDEATHSIG,
so they are killed even if the launcher itself is SIGKILLed.

When a worker fails, the launcher stops the others within ``grace`` seconds and reports the *first* failure as the
root cause: a rank that was killed, or that failed for a reason of its own, before the ranks that only reacted to
losing it.
"""

from __future__ import annotations

import ctypes
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
from hora.runner.output import OutputPump

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


@dataclass
class Failure:
    rank: int
    host: str
    pid: int
    returncode: int
    tail: list[str]
    when: float
    stopped: bool = False  # hora run's own stop signal ended it

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
    spec: LaunchSpec, rank: int, rdv: tuple[str, int], secret: bytes, job_id: str, master_port: int
) -> dict[str, str]:
    """Everything a worker gets: hora's variables, torchrun's names and Horovod's, plus the settings."""
    env = dict(os.environ if spec.env is None else spec.env)
    n = spec.np
    topo = {"RANK": rank, "SIZE": n, "LOCAL_RANK": rank, "LOCAL_SIZE": n, "CROSS_RANK": 0, "CROSS_SIZE": 1}
    for k, v in topo.items():
        env[f"HORA_{k}"] = str(v)
        env[f"HOROVOD_{k}"] = str(v)
    env["HORA_HOSTNAME"] = env["HOROVOD_HOSTNAME"] = spec.hostname
    env.update(
        HORA_RENDEZVOUS_ADDR=rdv[0],
        HORA_RENDEZVOUS_PORT=str(rdv[1]),
        HORA_SECRET=secret.hex(),
        HORA_JOB_ID=job_id,
        RANK=str(rank),
        WORLD_SIZE=str(n),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(n),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        PYTHONUNBUFFERED="1",
    )
    env.update(Config.env_for(spec.settings))
    return env


class _Job:
    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.procs: list[subprocess.Popen[bytes]] = []
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
        for i, p in enumerate(self.procs):
            if self.returncodes[i] is None:
                if sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
                    self.sent[i] = sig
                try:
                    os.killpg(p.pid, sig)  # the worker's own group: it and whatever it started
                except (ProcessLookupError, PermissionError):
                    pass

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
            # Whatever is left of its process group goes too (a shell's children, say).
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.log(f"rank {i} (pid {p.pid}) exited with {code}")
            if code != 0:
                stopped = code < 0 and self.sent[i] is not None and -code in (self.sent[i], signal.SIGKILL)
                round_failures.append(Failure(i, self.spec.hostname, p.pid, code, [], now, stopped))
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

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self._sel: selectors.BaseSelector | None = None
        if hasattr(os, "pidfd_open"):
            try:
                sel = selectors.DefaultSelector()
                for i, p in enumerate(procs):
                    sel.register(os.pidfd_open(p.pid), selectors.EVENT_READ, i)
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


def launch(spec: LaunchSpec) -> RunResult:
    """Run ``spec.command`` as ``spec.np`` ranks on this machine and wait for them."""
    secret = new_secret()
    job_id = uuid.uuid4().hex[:16]
    server = RendezvousServer(secret, host="127.0.0.1", port=spec.rendezvous_port)
    try:
        rdv = server.bind()
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on 127.0.0.1:{spec.rendezvous_port} for the rendezvous: {exc.strerror}. "
            "Choose another --rendezvous-port, or leave it out to use a free port."
        ) from None
    job = _Job(spec)
    master_port = _free_port()
    previous: dict[int, object] = {}

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
        for rank in range(spec.np):
            env = worker_env(spec, rank, rdv, secret, job_id, master_port)
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
            job.procs.append(proc)
            job.pump.add(rank, proc.stdout, proc.stderr)  # type: ignore[arg-type]
            job.log(f"started rank {rank} as pid {proc.pid}: {' '.join(spec.command)}")
        server.start()
        job.pump.start()
        exits = _ExitWatcher(job.procs)
        deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
        while not job.reap(exits.wait(0.05)):
            now = time.monotonic()
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
            p.wait()
        raise
    finally:
        if exits is not None:
            exits.close()
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
