"""``hora run`` in elastic mode: start a worker per slot of each round, watch them, and form the next round when
the current one is over (:mod:`.driver`), until a worker succeeds or the job cannot go on.

Each worker runs in its own session, as in a static job (:mod:`hora.runner.launch`), with ``HOROVOD_ELASTIC=1``,
its slot (``HORA_ELASTIC_SLOT``) and the round it was started for. A worker that fails gets its host blacklisted;
the survivors, resetting inside ``hvd.elastic.run``, join the next round. Workers left out of a round (their host
was removed or blacklisted) are stopped before the round is published. Output lines are prefixed with the worker's
number: its rank in the round it was started for, later workers numbered on from the last.

Hosts on this machine (``localhost``, this host's names, 127.x addresses) run their workers directly; other hosts
over SSH, one session running hora's agent per worker (:mod:`hora.runner.remote_host`), each new host checked
first as ``hora run -H`` checks its hosts.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hora._proc import handle_signals
from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousServer
from hora._transport.shm import sweep
from hora.config import Config
from hora.config.variables import environment
from hora.errors import ConfigError, HostError
from hora.runner.elastic.discovery import (
    DiscoveredHosts,
    DiscoveryError,
    FixedHosts,
    HostDiscovery,
    HostDiscoveryScript,
    HostManager,
)
from hora.runner.elastic.driver import FAILURE, READY, SUCCESS, ElasticDriver, ElasticJobError, slot_id
from hora.runner.elastic.workers import JobContext, ProcessStarter, Worker, WorkerStarter
from hora.runner.hosts import HostSlots, is_local_host
from hora.runner.output import OutputPump
from hora.runner.result import Failure, RunResult, root_cause
from hora.runner.ssh import SshOptions, advertise_address, preflight
from hora.runner.stacks import StackDumps, where

__all__ = ["DISCOVER_HOSTS_FREQUENCY_SECS", "ElasticSpec", "launch_elastic"]

#: How often the discovery script runs (Horovod's frequency).
DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
#: A member that has not left its round this long after every other member did is stuck (the others left because
#: their collectives with it timed out): its stack is taken and it is killed, so the job can re-form. An engine's
#: workers get their starter's ``loss_detection`` on top (a lost Spark executor is found lost, not killed as stuck).
STUCK_AFTER = 2.0


@dataclass
class ElasticSpec:
    command: Sequence[str]
    np: int | None = None
    min_np: int | None = None
    max_np: int | None = None
    discovery_script: str | None = None
    hosts: Sequence[HostSlots] | None = None  # fixed hosts (-H) when there is no discovery script
    slots_per_host: int = 1
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    env: Mapping[str, str] | None = None
    settings: Mapping[str, object] = field(default_factory=dict)
    output_filename: str | None = None
    capture: bool = False
    verbose: bool = False
    grace: float | None = None  # default: the grace_period setting
    timeout: float | None = None
    cwd: str | None = None
    rendezvous_port: int = 0
    ssh: SshOptions | None = None  # how remote hosts are reached (as hora run -H)
    network_interface: str | None = None
    start_timeout: float = 30.0


def _counts(spec: ElasticSpec) -> tuple[int, int, int | None]:
    """(np, min_np, max_np) checked as horovodrun checks them."""
    np = spec.np if spec.np is not None else spec.min_np
    if np is None:
        raise ConfigError("give the number of processes to start: -np N (or --min-np)")
    min_np = spec.min_np if spec.min_np is not None else np
    max_np = spec.max_np
    if min_np < 1:
        raise ConfigError(f"--min-np must be at least 1, got {min_np}")
    if np < min_np:
        raise ConfigError(f"-np {np} is less than --min-np {min_np}")
    if max_np is not None and max_np < max(np, min_np):
        raise ConfigError(f"--max-np {max_np} is less than -np {np} / --min-np {min_np}")
    if spec.reset_limit is not None and spec.reset_limit < 0:
        raise ConfigError(f"--reset-limit must be 0 or more, got {spec.reset_limit}")
    if spec.slots_per_host < 1:
        raise ConfigError(f"--slots-per-host must be at least 1, got {spec.slots_per_host}")
    return np, min_np, max_np


class _CheckedHosts:
    """The job's discovery, each new remote host checked over SSH first (as hora run -H checks them): a host that
    fails the check is left out, said once. Without a store the remote hosts can reach, remote hosts are refused."""

    def __init__(self, discovery: HostDiscovery, ssh: SshOptions, routable: bool, note: Callable[[str], None]):
        self._discovery, self._ssh, self._routable, self._note = discovery, ssh, routable, note
        self.checked: set[str] = set()
        self._failed: set[str] = set()

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        found = self._discovery.find_available_hosts_and_slots()
        remote = [h for h in found if not is_local_host(h)]
        if remote and not self._routable:
            raise DiscoveryError(
                f"the discovery gave remote hosts ({', '.join(remote)}) but the job started with this machine's "
                "hosts only, so its rendezvous listens on loopback: start it with --network-interface NIC (or "
                "with a remote host in the first discovery) to let remote hosts join"
            )
        for host in remote:  # new hosts come one or a few at a time: each is checked on its own
            if host in self.checked or host in self._failed:
                continue
            try:
                preflight([host], self._ssh)
                self.checked.add(host)
            except HostError as exc:
                self._failed.add(host)
                self._note(f"left out of the job: {exc}")
        return {h: n for h, n in found.items() if h not in self._failed}


def launch_elastic(
    spec: ElasticSpec,
    discovery: HostDiscovery | None = None,
    store_host: str = "127.0.0.1",
    starter: Callable[[JobContext], WorkerStarter] | None = None,
) -> RunResult:
    """Run ``spec.command`` as an elastic job and wait for it (see the module's docstring).

    A cluster engine (:mod:`hora.ray.elastic`) gives its own ``discovery`` of hosts, the address its workers reach
    this process on (``store_host``) and a ``starter`` of its workers; ``spec.command`` is then unused.

    Raises:
        ConfigError: bad counts or flags, or the first run of the discovery failed (nothing was started).
        HostError: a remote host of the first discovery failed the SSH check.
    """
    np, min_np, max_np = _counts(spec)
    base_env = dict(environment() if spec.env is None else spec.env)
    config = Config.resolve(env=base_env, overrides=spec.settings)
    if config.num_ps or config.ps_per_host:
        raise ConfigError("parameter servers (--num-ps) cannot be combined with an elastic job (--min-np ...)")
    if discovery is not None:
        host, found = store_host, discovery
    else:
        host, found = _hosts_of(spec)
    manager = HostManager(found, spec.cooldown_range)
    secret, job_id = new_secret(), uuid.uuid4().hex[:16]
    server = RendezvousServer(secret, host=host, port=spec.rendezvous_port, max_frame_bytes=config.max_frame_bytes)
    try:
        rdv = server.start()
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{spec.rendezvous_port} for the rendezvous: {exc.strerror}"
        ) from None
    context = JobContext(rdv, secret, job_id, spec.settings, spec.max_np)
    job = _ElasticJob(spec, config, server, context, base_env, starter)
    job.driver = ElasticDriver(manager, server, f"{job_id}/elastic/", min_np, max_np, spec.reset_limit, job.log)
    try:
        job.driver.discover()
    except DiscoveryError as exc:
        server.shutdown()
        raise ConfigError(str(exc)) from None
    try:
        return job.run(np)
    finally:
        server.shutdown()
        for name in sweep(job_id):
            job.log(f"removed shared memory {name} that a crashed worker left behind")


def _hosts_of(spec: ElasticSpec) -> tuple[str, HostDiscovery]:
    """The discovery of ``spec`` (its script, or its fixed hosts), each new remote host checked over SSH, and the
    address the store listens on (routable when remote hosts take part)."""
    if spec.discovery_script:
        discovery: HostDiscovery = HostDiscoveryScript(spec.discovery_script, spec.slots_per_host)
    elif spec.hosts and len(spec.hosts) >= 2:
        discovery = FixedHosts({h.host: h.slots for h in spec.hosts})
    else:
        raise ConfigError(
            "an elastic job needs --host-discovery-script, or at least two hosts with -H (one host cannot lose a "
            "host and go on)"
        )
    ssh = spec.ssh or SshOptions()
    try:
        first = discovery.find_available_hosts_and_slots()
    except DiscoveryError as exc:
        raise ConfigError(str(exc)) from None
    remote = [h for h in first if not is_local_host(h)]
    if remote or spec.network_interface:  # remote hosts must reach the store and the local workers
        host = advertise_address(remote, spec.network_interface, preflight(remote, ssh) if remote else {})
    else:
        host = "127.0.0.1"
    checked = _CheckedHosts(discovery, ssh, host != "127.0.0.1", _note)
    checked.checked.update(remote)
    return host, checked


class _ElasticJob:
    def __init__(
        self,
        spec: ElasticSpec,
        config: Config,
        server: RendezvousServer,
        context: JobContext,
        base_env: dict[str, str],
        starter: Callable[[JobContext], WorkerStarter] | None,
    ) -> None:
        self.spec, self.config, self.server, self.context = spec, config, server, context
        self.job_id = context.job_id
        self.driver: ElasticDriver
        self.pump = OutputPump(spec.output_filename, capture=spec.capture)
        self.workers: list[Worker] = []
        self.failures: list[Failure] = []
        self.interrupted: int | None = None
        self.grace = spec.grace if spec.grace is not None else config.grace_period
        self.stacks = StackDumps(self.job_id)
        self.starter: WorkerStarter = starter(context) if starter is not None else ProcessStarter(
            context,
            spec.command,
            base_env,
            self.pump,
            str(self.stacks.directory),
            self.grace,
            spec.cwd,
            spec.ssh,
            spec.network_interface,
            spec.start_timeout,
            spec.capture,
            self.log,
            config.merge_stderr,
        )
        self._alone_since: float | None = None  # since when only stuck members keep the round from ending
        self._stop_discovery = threading.Event()

    def log(self, message: str) -> None:
        if self.spec.verbose:
            print(f"hora run: {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        """What a user of an elastic job must see even without --verbose (a worker lost, a new round)."""
        _note(message)

    # -- the job -----------------------------------------------------------------------------------------------
    def run(self, np: int) -> RunResult:
        release = self.pump.hold_open()
        self.pump.start()
        discovery = threading.Thread(target=self._discover, name="hora-elastic-discovery", daemon=True)
        discovery.start()
        reason, timed_out = "", False

        def on_signal(signum: int, frame: object) -> None:
            if self.interrupted is None:
                self.interrupted = signum
            else:
                self._signal_live(signal.SIGKILL)

        with handle_signals(on_signal, signal.SIGINT, signal.SIGTERM):
            try:
                deadline = time.monotonic() + self.config.elastic_timeout
                self._next_round(self.driver.wait_for_slots(np, deadline, self._stopping))
                reason, timed_out = self._supervise()
            except ElasticJobError as exc:
                reason = str(exc)
            finally:
                self._stop_discovery.set()
                if timed_out:
                    self._take_stacks([w for w in self.workers if w.code is None])
                self._stop_all(signal.SIGTERM if self.interrupted is None else self.interrupted)
                self.starter.close()
                release()
                saved = self.stacks.save(self.spec.output_filename, keep=not self.spec.capture)
        discovery.join(5.0)
        self.pump.join(timeout=5.0)
        for f in self.failures:
            f.tail = list(self.pump.tails.get(f.rank, [])) or f.tail
        codes = [w.code for w in self.workers]
        if timed_out:
            exit_code = 124
        elif self.interrupted is not None:
            exit_code = 128 + self.interrupted
        else:
            exit_code = 1 if reason else 0
        root = root_cause([f for f in self.failures if not f.stopped]) if reason else None
        return RunResult(
            exit_code,
            codes,
            root,
            self.failures if exit_code else [],
            self.interrupted,
            timed_out,
            self.pump.lines if self.spec.capture else {},
            self.job_id,
            reason=reason,
            stacks=self.stacks.captured if exit_code else {},
            stacks_saved=saved,
        )

    def _stopping(self) -> bool:
        return self.interrupted is not None

    def _discover(self) -> None:
        while not self._stop_discovery.wait(DISCOVER_HOSTS_FREQUENCY_SECS):
            try:
                self.driver.discover()
            except DiscoveryError as exc:  # later failures are retried (Horovod's rule)
                self.note(f"{exc}; trying again in {DISCOVER_HOSTS_FREQUENCY_SECS:g}s")

    def _supervise(self) -> tuple[str, bool]:
        """Watch the workers and form rounds until the job ends; (why it failed or "", whether it timed out)."""
        deadline = None if self.spec.timeout is None else time.monotonic() + self.spec.timeout
        while True:
            if self.interrupted is not None:
                return "", False
            now = time.monotonic()
            if deadline is not None and now > deadline:
                self.note("time limit reached: taking every worker's stacks and stopping them")
                return "", True
            for w in self.workers:
                if w.session is not None and w.code is None:
                    w.session.check(now)
            self._reap(now)
            self._drain_leaving(now)
            for sid in self.driver.ready_slots():
                self.driver.record(sid, READY)
            decision = self.driver.decide()
            self._kill_stuck(now, decision is None)
            if decision is not None:
                if decision.action == "done":
                    return "", False
                for host in decision.blacklisted:
                    self.note(f"host {host} is blacklisted{self._cooldown(host)}")
                if decision.action == "fail":
                    return decision.message, False
                hosts = self.driver.wait_for_slots(
                    self.driver.min_np, time.monotonic() + self.config.elastic_timeout, self._stopping
                )
                self._next_round(hosts)
            for w in self.workers:
                if w.code is None and w.stop_by is not None and now > w.stop_by:
                    w.proc.signal(signal.SIGKILL)
            time.sleep(0.02)

    def _kill_stuck(self, now: float, undecided: bool) -> None:
        """Members that keep a round from ending while every other member has left it: take their stacks, kill."""
        stuck = self.driver.unreported() if undecided else []
        if not stuck or len(stuck) == len(self.driver.members):
            self._alone_since = None
            return
        if self._alone_since is None:
            self._alone_since = now
        if now - self._alone_since < STUCK_AFTER + self.starter.loss_detection:
            return
        self._alone_since = None
        workers = [
            w for w in self.workers if w.code is None and w.sid in stuck and w.stop_by is None and not w.stuck_killed
        ]
        got = self._take_stacks(workers)
        for w in workers:
            dump = got.get(w.index, "")
            if dump:
                detail = f"it is stuck at {'; '.join(where(dump))}"
                if not self.spec.capture:
                    detail += f" (all its threads: {self.stacks.directory}/rank.{w.index}.stacks)"
            elif w.session is not None or w.proc.pid > 0:
                detail = "it did not answer SIGUSR1 with its stack"
            else:
                detail = "its stack cannot be taken (an engine's worker: a Ray actor, a Spark task's child)"
            self.note(
                f"worker {w.index} ({w.sid}) did not leave round {self.driver.round} while every other worker did: "
                f"{detail} — killing it"
            )
            w.stuck_killed = True
            w.proc.signal(signal.SIGKILL)

    def _take_stacks(self, workers: list[Worker]) -> dict[int, str]:
        """The stacks of ``workers``: local processes directly, SSH hosts' workers through their agents (an
        engine's workers have none to give)."""
        local = {w.index: w.proc.pid for w in workers if w.session is None and w.proc.pid > 0}
        return self.stacks.capture(local, remote={w.index: w.session for w in workers if w.session is not None})

    def _drain_leaving(self, now: float) -> None:
        """Workers that got SIGTERM (preempted) said so at the store: their host leaves at the next commit."""
        for sid in self.driver.leaving_slots():
            host = self.driver.members[sid].host
            if self.driver.hosts.is_blacklisted(host):
                continue
            self.note(
                f"worker {sid} got SIGTERM: host {host} leaves the job at the next commit() (killed if it has not "
                f"within {self.grace:g}s)"
            )
            self.driver.drain(host)
            for w in self.workers:
                if w.code is None and w.slot.host == host and w.stop_by is None:
                    if w.sid != sid:
                        w.proc.signal(signal.SIGTERM)  # the host's other workers go with it, as in a reclaim
                    w.stop_by = now + self.grace

    def _cooldown(self, host: str) -> str:
        end = self.driver.hosts.state(host).cooldown_end
        return f" for {max(0.0, end - time.time()):.0f}s" if end else " (for the rest of the job)"

    def _reap(self, now: float) -> None:
        for w in self.workers:
            if w.code is not None:
                continue
            code = w.proc.poll()
            if code is None:
                continue
            w.code = code
            w.proc.reaped()
            counted = self.driver.record(w.sid, SUCCESS if code == 0 else FAILURE)
            self.log(f"worker {w.index} ({w.sid}, pid {w.proc.pid}) exited with {code}")
            if not counted and w.stop_by is not None:
                self.note(f"worker {w.index} ({w.sid}) left the job")
            if code != 0 and counted:
                tail = list(getattr(w.proc, "tail", []))  # what an engine's worker said (no output pump)
                failure = Failure(w.index, w.slot.host, w.proc.pid, code, tail, now, stopped=False)
                self.failures.append(failure)
                self.driver.call_off(f"worker {w.sid} of round {self.driver.round} failed ({failure.describe()})")
                self.note(
                    f"worker {w.index} ({w.sid}, rank {self.driver.members[w.sid].rank} of round "
                    f"{self.driver.round}) failed: {failure.describe()}; the others go on without it"
                )

    def _next_round(self, hosts: DiscoveredHosts) -> None:
        slots, left_out = self.driver.form_round(hosts)
        now = time.monotonic()
        for w in self.workers:  # stopped before the round is published: they go quietly
            if w.code is None and w.stop_by is None and w.sid not in self.driver.members:
                w.proc.signal(signal.SIGTERM)
                w.stop_by = now + self.grace
        self.driver.publish(left_out)
        live = {w.sid for w in self.workers if w.code is None and w.stop_by is None}
        for slot in slots:
            if slot_id(slot) not in live:
                self.workers.append(self.starter.start(slot, len(slots), self.driver.round, len(self.workers)))
        hosts_used = sorted({s.host for s in slots})
        if self.driver.round > 1:
            self.note(f"round {self.driver.round}: {len(slots)} ranks on {', '.join(hosts_used)}")
        else:
            self.log(f"round 1: {len(slots)} ranks on {', '.join(hosts_used)}")

    def _signal_live(self, sig: int) -> None:
        for w in self.workers:
            if w.code is None:
                w.proc.signal(sig)

    def _stop_all(self, sig: int) -> None:
        """Stop every worker still running: ``sig``, then SIGKILL after the grace period. ``stopping`` at the store
        tells hora's SIGTERM handler in the workers that the job ends (not a graceful leave)."""
        self.server.put({f"{self.job_id}/elastic/stopping": "1"})
        self._signal_live(sig)
        end = time.monotonic() + self.grace
        while any(w.code is None for w in self.workers) and time.monotonic() < end:
            self._reap_quietly()
            time.sleep(0.02)
        self._signal_live(signal.SIGKILL)
        for w in self.workers:
            w.code = self.starter.end(w, self.grace + 5.0)

    def _reap_quietly(self) -> None:
        for w in self.workers:
            if w.code is None and (code := w.proc.poll()) is not None:
                w.code = code
                w.proc.reaped()



def _note(message: str) -> None:
    print(f"hora run: {message}", file=sys.stderr, flush=True)
