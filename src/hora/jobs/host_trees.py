"""The hosts of one attempt: one process tree per host (:mod:`hora.jobs._host`), started by the supervisor — the
other hosts first, then the master, which runs hora run — and stopped so that none outlives the attempt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hora._proc import die_with_parent, kill_group
from hora.errors import HostStartError
from hora.jobs.cluster import socket_path
from hora.jobs.outcome import describe_code

__all__ = ["HOST_START_SECONDS", "HostTrees"]

#: How long the supervisor waits for each non-master host's agent to listen before starting the master anyway
#: (the master's connections retry for as long again).
HOST_START_SECONDS = 30.0


class HostTrees:
    """The host agents of the job in ``job_dir``; ``hosts[0]`` is the master."""

    def __init__(self, job_dir: Path, hosts: list[str], stop_grace: float, say: Callable[[str], None]) -> None:
        self.job_dir, self.hosts, self.stop_grace, self.say = job_dir, hosts, stop_grace, say
        self._agents: dict[str, subprocess.Popen[bytes]] = {}
        #: the stop signal forwarded to the master's hora run during this attempt, if any
        self.interrupted: int | None = None

    def _start(self, host: str, attempt: int, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "hora.jobs._host", str(self.job_dir), host, str(attempt)],
            cwd=self.job_dir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C on the terminal reaches the supervisor only; it stops the hosts
            preexec_fn=die_with_parent,  # the hosts die with their supervisor
        )

    def forward(self, signum: int) -> bool:
        """A stop signal while the ranks run: the master's hora run stops them (a second signal kills every
        host). False when the master is not running (the caller handles the signal)."""
        master = self._agents.get(self.hosts[0])
        if master is None or master.poll() is not None:
            return False
        if self.interrupted is None:
            self.interrupted = signum
            master.send_signal(signum)
        else:  # a second signal: no more patience. Killed, not waited for: this runs in a signal handler, maybe
            # inside a wait() of the same process (the main thread's, or a third signal's), and Popen.wait is not
            # reentrant: a nested wait would spin forever on the lock the interrupted one holds. run() waits.
            for proc in self._agents.values():
                if proc.poll() is None:
                    kill_group(proc.pid, signal.SIGKILL)
        return True

    def stop(self, sig: int) -> None:
        for proc in self._agents.values():
            if proc.poll() is None:
                kill_group(proc.pid, sig)
        if sig == signal.SIGKILL:
            for proc in self._agents.values():
                proc.wait()

    def run(self, attempt: int, env: Mapping[str, str]) -> dict[str, int]:
        """One attempt: start every host's process tree, wait for the master's hora run to end, let the other
        hosts finish; returns each host agent's exit code. HostStartError when a host ended before the master
        started."""
        self.interrupted = None
        self._agents = {}
        try:
            for host in self.hosts[1:]:
                self._agents[host] = self._start(host, attempt, env)
            deadline = time.monotonic() + HOST_START_SECONDS
            for host in self.hosts[1:]:  # the master's first connections would only retry meanwhile
                while (
                    not socket_path(self.job_dir, host).exists()
                    and self._agents[host].poll() is None
                    and time.monotonic() < deadline
                    and self.interrupted is None
                ):
                    time.sleep(0.05)
            gone = {h: p.returncode for h, p in self._agents.items() if p.poll() is not None}
            if gone:  # the master would only wait for them in vain
                ended = "\n  ".join(
                    f"{h}'s agent ended ({describe_code(code)}) before the master started; see its messages "
                    "in the job's output (logs/supervisor.err for a detached job)"
                    for h, code in gone.items()
                )
                raise HostStartError(f"the job's hosts failed:\n  {ended}")
            master = self._start(self.hosts[0], attempt, env)
            self._agents[self.hosts[0]] = master
            while master.poll() is None:
                time.sleep(0.1)
            # The other hosts end when the master's sessions with them close; give them the grace period to.
            deadline = time.monotonic() + self.stop_grace + 10.0
            while any(p.poll() is None for p in self._agents.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
            stragglers = [h for h, p in self._agents.items() if p.poll() is None]
            if stragglers:
                self.say(f"host(s) {', '.join(stragglers)} still ran after the master ended; stopping them")
            self.stop(signal.SIGTERM)
            time.sleep(0.5 if stragglers else 0)
            self.stop(signal.SIGKILL)
            return {h: p.returncode for h, p in self._agents.items()}
        except BaseException:  # a stop before the master started, or a bug: no host may outlive it
            self.stop(signal.SIGTERM)
            time.sleep(0.5)
            self.stop(signal.SIGKILL)
            raise
        finally:
            self._agents = {}
