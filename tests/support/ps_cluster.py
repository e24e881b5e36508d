"""Parameter servers as real processes (``python -m hora.ps``) around a rendezvous store in the test process, as
``hora run --num-ps`` starts them, for tests that drive clients directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hora._runtime.auth import new_secret
from hora._runtime.rendezvous import RendezvousClient, RendezvousServer
from hora.ps.client import Client
from hora.ps.directory import server_addresses

#: Seconds any wait of these helpers may take before the test fails instead of hanging.
LIMIT = 60.0


class PsCluster:
    def __init__(self, num_ps: int, workers: int, extra_env: dict[str, str] | None = None) -> None:
        self.secret = new_secret()
        self.workers = workers
        self.store = RendezvousServer(self.secret)
        addr, port = self.store.start()
        job = f"pstest{os.getpid()}{time.monotonic_ns()}"
        env = dict(os.environ)
        env.update(HORA_SECRET=self.secret.hex(), HORA_RENDEZVOUS_ADDR=addr, HORA_RENDEZVOUS_PORT=str(port), HORA_JOB_ID=job,
                   HORA_OP_TIMEOUT_SECONDS=str(LIMIT))  # fmt: skip
        env.update(extra_env or {})
        self.procs = []
        for i in range(num_ps):
            argv = [sys.executable, "-m", "hora.ps", "--index", str(i), "--workers", str(workers)]
            pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            self.procs.append(subprocess.Popen(argv, env=env, **pipes))
        try:
            client = RendezvousClient(addr, port, self.secret, 99, f"{job}/0/ps/", time.monotonic() + LIMIT)
            try:
                self.addresses = server_addresses(client, num_ps, LIMIT)
            finally:
                client.close()
        except BaseException:
            self.close()
            raise

    def client(self, rank: int, **kwargs) -> Client:
        kwargs.setdefault("op_timeout", LIMIT)
        return Client(self.addresses, self.secret, rank, **kwargs)

    def kill(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGKILL)
        self.procs[index].wait(LIMIT)

    def close(self) -> dict[int, str]:
        """Stop every server (SIGTERM: they must exit 0) and return their stderr by index."""
        errs = {}
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for i, p in enumerate(self.procs):
            try:
                _, err = p.communicate(timeout=LIMIT)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate(timeout=LIMIT)
            errs[i] = err.decode(errors="replace")
        self.store.shutdown()
        return errs
