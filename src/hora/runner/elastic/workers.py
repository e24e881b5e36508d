"""How an elastic job's workers start and end: a process on this machine, an SSH session running hora's agent on
another host (:mod:`hora.runner.remote_host`), or — behind the same :class:`WorkerStarter` interface — a Ray actor
(:mod:`hora.ray.elastic`) or a Spark task's child process (:mod:`hora.spark.elastic`). Every worker gets ``hora
run``'s worker environment for its slot plus the elastic variables (``HOROVOD_ELASTIC=1``, its slot, the round it
was started for, ``--max-np``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hora._proc import die_with_parent, usable_cpus
from hora.runner.elastic.driver import slot_id
from hora.runner.hosts import RankSlot, is_local_host
from hora.runner.in_process import rank_env
from hora.runner.launch import _free_port, _hora_path, _is_ip, forwarded_env
from hora.runner.output import OutputPump
from hora.runner.reaper import GroupReaper
from hora.runner.remote_host import RemoteHost
from hora.runner.ssh import SshOptions, remote_agent_command, ssh_command
from hora.runner.supervise import LocalRank

__all__ = ["JobContext", "ProcessStarter", "Worker", "WorkerHandle", "WorkerStarter", "elastic_env", "wait_gone"]


class WorkerHandle(Protocol):
    """What the launcher needs of a running worker (a local process, a remote rank, a Ray actor, a Spark task's
    child). A handle whose output does not reach the launcher's pump may also have ``tail``: the last lines it said,
    for the failure report."""

    pid: int

    def poll(self) -> int | None: ...

    def signal(self, sig: int) -> None: ...

    def reaped(self) -> None: ...


@dataclass
class Worker:
    index: int
    slot: RankSlot  # its place in the round it was started for
    proc: WorkerHandle
    session: RemoteHost | None = None  # a remote worker's SSH session (one per worker)
    code: int | None = None
    stop_by: float | None = None  # SIGKILL after this (it was sent SIGTERM)
    stuck_killed: bool = False  # SIGKILLed for keeping a round from ending

    @property
    def sid(self) -> str:
        return slot_id(self.slot)


@dataclass
class JobContext:
    """What every worker's environment says of the job."""

    rendezvous: tuple[str, int]
    secret: bytes
    job_id: str
    settings: Mapping[str, object]
    max_np: int | None
    master: tuple[str, int] = ("", 0)

    def __post_init__(self) -> None:
        if not self.master[0]:
            self.master = (self.rendezvous[0], _free_port())


def elastic_env(
    ctx: JobContext,
    slot: RankSlot,
    size: int,
    round_: int,
    base: Mapping[str, str],
    bind: str | None,
    cpus: int | None,
) -> dict[str, str]:
    """The environment of the worker of ``slot`` started for round ``round_`` of ``size`` ranks."""
    env = rank_env(slot, size, ctx.rendezvous, ctx.secret, ctx.job_id, ctx.master, bind, base, ctx.settings, cpus)
    env.update({"HOROVOD_ELASTIC": "1", "HORA_ELASTIC_SLOT": slot_id(slot), "HORA_ELASTIC_ROUND": str(round_)})
    if ctx.max_np is not None:
        env["HORA_ELASTIC_MAX_NP"] = str(ctx.max_np)
    return env


class WorkerStarter(Protocol):
    #: Seconds this starter may take to notice that a worker's host is gone (a Spark executor's heartbeats): a
    #: worker that has not left its round is taken for stuck only that much later, so a lost host is found lost
    #: (and blacklisted), not killed as stuck. 0 for processes, whose end is seen at once.
    loss_detection: float

    def start(self, slot: RankSlot, size: int, round_: int, index: int) -> Worker:
        """Start the worker of ``slot`` for round ``round_``; ``index``: its number in the job."""
        ...

    def end(self, worker: Worker, timeout: float) -> int | None:
        """After SIGKILL: wait (up to ``timeout``) for the worker to be gone; its exit code."""
        ...

    def close(self) -> None: ...


class ProcessStarter:
    """Workers as processes: on this machine directly (own session, PR_SET_PDEATHSIG, output through the pump), on
    other hosts through one SSH session running hora's agent each."""

    loss_detection = 0.0

    def __init__(
        self,
        ctx: JobContext,
        command: Sequence[str],
        base_env: Mapping[str, str],
        pump: OutputPump,
        stacks_dir: str,
        grace: float,
        cwd: str | None,
        ssh: SshOptions | None,
        network_interface: str | None,
        start_timeout: float,
        capture: bool,
        log: Any,
        merge_stderr: bool = False,
    ) -> None:
        self.ctx, self.command, self.base_env, self.pump = ctx, list(command), dict(base_env), pump
        self.stacks_dir, self.grace, self.cwd, self.ssh = stacks_dir, grace, cwd, ssh or SshOptions()
        self.network_interface, self.start_timeout = network_interface, start_timeout
        self.capture, self.log, self.merge_stderr = capture, log, merge_stderr
        self.reaper = GroupReaper()  # ends the local workers' process groups should the launcher be killed
        self.reaper.remove_on_death(stacks_dir)

    def start(self, slot: RankSlot, size: int, round_: int, index: int) -> Worker:
        remote = not is_local_host(slot.host)
        if self.ctx.rendezvous[0] != "127.0.0.1":  # remote hosts take part: local workers listen where reachable
            bind: str | None = None if remote else self.ctx.rendezvous[0]
        else:
            bind = slot.host if _is_ip(slot.host) else None
        base = forwarded_env(self.base_env) if remote else self.base_env
        env = elastic_env(self.ctx, slot, size, round_, base, bind, None if remote else usable_cpus())
        if remote:
            return self._start_remote(slot, env, index)
        env["HORA_STACKS_DIR"] = self.stacks_dir
        proc = subprocess.Popen(
            self.command,
            env=env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self.merge_stderr else subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.pump.add(index, proc.stdout, proc.stderr)  # type: ignore[arg-type]
        self.reaper.add(proc.pid)
        self.log(f"started worker {index} for {slot_id(slot)} (rank {slot.rank}) as pid {proc.pid}")
        return Worker(index, slot, LocalRank(proc))

    def _start_remote(self, slot: RankSlot, env: dict[str, str], index: int) -> Worker:
        """One SSH session running the hora agent for this one worker (hora run -H's agent)."""
        forwarded = forwarded_env(self.base_env)
        paths = [_hora_path(), *forwarded.get("PYTHONPATH", "").split(os.pathsep)]
        description = {
            "command": self.command,
            "cwd": os.path.abspath(self.cwd or os.getcwd()),
            "env": forwarded,
            "ranks": [{"rank": index, "env": {k: v for k, v in env.items() if forwarded.get(k) != v}}],
            "servers": [],
            "workers": 1,
            "grace": self.grace,
            "network_interface": self.network_interface,
            "merge_stderr": self.merge_stderr,
        }
        agent = remote_agent_command(sys.executable, os.pathsep.join(dict.fromkeys(p for p in paths if p)))
        argv = ssh_command(slot.host, self.ssh, agent)
        session = RemoteHost(
            slot.host,
            [index],
            argv,
            description,
            self.pump,
            self.start_timeout + 10.0,
            die_with_parent,
            echo_stderr=not self.capture,
        )
        session.start()
        session.start_threads()
        self.log(f"started worker {index} for {slot_id(slot)} (rank {slot.rank}) over SSH: {' '.join(argv)}")
        return Worker(index, slot, session.ranks[index], session)

    def end(self, worker: Worker, timeout: float) -> int | None:
        if worker.session is not None:
            worker.session.close(timeout=timeout)  # the agent stops what still runs there
            return worker.code if worker.code is not None else worker.proc.poll()
        if worker.code is not None:
            return worker.code
        assert isinstance(worker.proc, LocalRank)
        code = worker.proc.proc.wait()
        worker.proc.reaped()
        return code

    def close(self) -> None:
        self.reaper.close()


def wait_gone(handle: WorkerHandle, timeout: float) -> int | None:
    """Poll ``handle`` until it reports an exit code (or ``timeout`` passes)."""
    end = time.monotonic() + timeout
    while (code := handle.poll()) is None and time.monotonic() < end:
        time.sleep(0.05)
    return code

