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
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousServer
from hora.config import Config
from hora.runner.output import OutputPump

__all__ = ["Failure", "LaunchSpec", "RunResult", "launch"]

_PR_SET_PDEATHSIG = 1
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


@dataclass
class Failure:
    rank: int
    host: str
    pid: int
    returncode: int
    tail: list[str]
    when: float
    stopped: bool = False  # it exited after hora run had started stopping the job

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
            head = (f"hora run: rank {self.root_cause.rank} failed first (the root cause, below); "
                    "the other ranks were stopped.")
        lines = ["=" * 78, head]
        rc = self.root_cause
        if rc is not None:
            lines += [f"  rank  : {rc.rank}", f"  host  : {rc.host}", f"  pid   : {rc.pid}", f"  exit  : {rc.describe()}"]
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


def worker_env(spec: LaunchSpec, rank: int, rdv: tuple[str, int], secret: bytes, job_id: str, master_port: int) -> dict[str, str]:
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
    env.update(Config.resolve(env={}, overrides=dict(spec.settings)).to_env())
    return env


class _Job:
    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.procs: list[subprocess.Popen[bytes]] = []
        self.returncodes: list[int | None] = [None] * spec.np
        self.failures: list[Failure] = []
        self.interrupted: int | None = None
        self.stopping_at: float | None = None
        self.pump = OutputPump(spec.output_filename, capture=spec.capture, prefix=spec.prefix_output)

    def log(self, message: str) -> None:
        if self.spec.verbose:
            print(f"hora run: {message}", file=sys.stderr, flush=True)

    def signal_all(self, sig: int) -> None:
        for i, p in enumerate(self.procs):
            if self.returncodes[i] is None:
                try:
                    os.killpg(p.pid, sig)  # the worker's own group: it and whatever it started
                except (ProcessLookupError, PermissionError):
                    pass

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()
            self.log(f"stopping the remaining ranks with {signal.Signals(sig).name}")
            self.signal_all(sig)

    def reap(self) -> bool:
        """Collect exited workers; True when all have exited."""
        now = time.monotonic()
        round_failures = []
        for i, p in enumerate(self.procs):
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
                stopped = self.stopping_at is not None or self.interrupted is not None
                round_failures.append(Failure(i, self.spec.hostname, p.pid, code, [], now, stopped))
        if round_failures:
            # Ranks that died in the same polling round: put the one killed by a signal, or failing for a reason of
            # its own, before those that only reacted to losing it.
            round_failures.sort(key=lambda f: (f.returncode >= 0, f.rank))
            self.failures.extend(round_failures)
            if not all(f.stopped for f in round_failures):
                self.stop()
        return all(c is not None for c in self.returncodes)


def launch(spec: LaunchSpec) -> RunResult:
    """Run ``spec.command`` as ``spec.np`` ranks on this machine and wait for them."""
    secret = new_secret()
    job_id = uuid.uuid4().hex[:16]
    server = RendezvousServer(secret, host="127.0.0.1")
    rdv = server.bind()
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
    try:
        for rank in range(spec.np):
            env = worker_env(spec, rank, rdv, secret, job_id, master_port)
            proc = subprocess.Popen(
                list(spec.command), env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_child_setup,  # noqa: PLW1509
            )
            job.procs.append(proc)
            job.pump.add(rank, proc.stdout, proc.stderr)  # type: ignore[arg-type]
            job.log(f"started rank {rank} as pid {proc.pid}: {' '.join(spec.command)}")
        server.start()
        job.pump.start()
        deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
        while not job.reap():
            now = time.monotonic()
            if deadline is not None and now > deadline and not timed_out:
                timed_out = True
                job.log("time limit reached: dumping stacks (SIGUSR1) and killing every rank")
                job.signal_all(signal.SIGUSR1)
                time.sleep(1.0)
                job.stop(signal.SIGKILL)
            if job.stopping_at is not None and now - job.stopping_at > spec.grace:
                job.signal_all(signal.SIGKILL)
            time.sleep(0.02)
    except BaseException:
        job.signal_all(signal.SIGKILL)
        for p in job.procs:
            p.wait()
        raise
    finally:
        if in_main:
            for s, h in previous.items():
                signal.signal(s, h)  # type: ignore[arg-type]
        server.shutdown()
    job.pump.join(timeout=5.0)
    for f in job.failures:
        f.tail = list(job.pump.tails.get(f.rank, []))
    root = next((f for f in job.failures if not f.stopped), None)
    if timed_out:
        exit_code = 124
    elif job.interrupted is not None:
        exit_code = 128 + job.interrupted
    else:
        exit_code = root.exit_code if root else 0
    return RunResult(exit_code, job.returncodes, root, job.failures, job.interrupted, timed_out,
                     job.pump.lines if spec.capture else {}, job_id)
