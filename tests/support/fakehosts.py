"""Running test functions on ranks that pretend to be on several hosts of this machine.

Each rank is a real process started with torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``) plus ``HORA_HOSTNAME`` naming
its fake host, so hora groups the ranks by those names: shared memory among the ranks of one fake host, TCP
between fake hosts, exactly as on real hosts (short of the network in between). Rank 0 hosts the rendezvous store
and hands the secret to the others through a 0600 file in a private runtime directory, as under torchrun; no
secret is on any command line.

``python fakehosts.py DIR`` is the rank's entry point: it runs ``DIR/fn.pkl`` and writes ``DIR/result.<rank>.pkl``.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
FOREIGN = ("HORA_", "HOROVOD_", "OMPI_", "PMIX_", "SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "GROUP_RANK")


def layout(spec: str) -> list[str]:
    """``"a:3,b:1"`` -> ``["a", "a", "a", "b"]`` (ranks in host order); ``"a,b,a,b"`` -> that host per rank."""
    hosts: list[str] = []
    for part in spec.split(","):
        name, _, count = part.partition(":")
        hosts += [name] * int(count or 1)
    return hosts


@dataclass
class Outcome:
    returncodes: list[int]
    stderr: list[str]
    results: list[Any]
    timed_out: bool


def start(fn: Callable[..., Any], hosts: Sequence[str], args: Sequence[Any], settings: dict[str, Any],
          timeout: float, stop_when: Callable[[], bool] | None = None) -> Outcome:
    """Run ``fn(*args)`` on one rank per entry of ``hosts`` (the fake host of each rank) and wait for all, or until
    ``stop_when()`` says the ranks still running may be killed (a test that stopped a rank on purpose)."""
    from hora.config import Config

    n = len(hosts)
    workdir = tempfile.mkdtemp(prefix="hora-fakehosts-")
    os.chmod(workdir, 0o700)
    with open(os.path.join(workdir, "fn.pkl"), "wb") as f:
        pickle.dump((fn, tuple(args)), f)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_id = uuid.uuid4().hex
    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    base["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    base.update(Config.env_for(settings))
    procs, files = [], []
    try:
        for r, host in enumerate(hosts):
            mates = [k for k, h in enumerate(hosts) if h == host]
            env = dict(base, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(mates.index(r)),
                       LOCAL_WORLD_SIZE=str(len(mates)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       TORCHELASTIC_RUN_ID=run_id, HORA_HOSTNAME=host, HORA_RUNTIME_DIR=os.path.join(workdir, "rt"),
                       PYTHONUNBUFFERED="1")
            err = open(os.path.join(workdir, f"stderr.{r}"), "w+")  # noqa: SIM115 - closed below
            files.append(err)
            procs.append(subprocess.Popen([sys.executable, str(HERE), workdir], env=env, stdout=subprocess.DEVNULL,
                                          stderr=err))
        deadline = time.monotonic() + timeout
        timed_out = False
        while any(p.poll() is None for p in procs):
            if stop_when is not None and stop_when():
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
        if timed_out:  # dump every rank's stacks into its stderr, then end them
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    stderr = []
    for f in files:
        f.seek(0)
        stderr.append(f.read())
        f.close()
    results = []
    for r in range(n):
        path = os.path.join(workdir, f"result.{r}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        else:
            results.append(None)
    shutil.rmtree(workdir, ignore_errors=True)
    return Outcome([p.returncode for p in procs], stderr, results, timed_out)


def _dump(outcome: Outcome, hosts: Sequence[str]) -> str:
    return "\n".join(f"--- rank {r} (host {hosts[r]}, exit {outcome.returncodes[r]}) ---\n{err[-6000:]}"
                     for r, err in enumerate(outcome.stderr))


def run_on_hosts(fn: Callable[..., Any], spec: str, *args: Any, timeout: float = 180.0, **settings: Any) -> list[Any]:
    """Run ``fn(*args)`` on the fake hosts of ``spec`` (see :func:`layout`); fail the test unless every rank
    succeeds; return the per-rank results."""
    import pytest

    hosts = layout(spec)
    outcome = start(fn, hosts, args, settings, timeout)
    if outcome.timed_out or any(outcome.returncodes):
        what = f"hung past {timeout:g}s" if outcome.timed_out else "failed"
        pytest.fail(f"the job on {spec} {what}:\n{_dump(outcome, hosts)}", pytrace=False)
    return outcome.results


def run_failing_on_hosts(fn: Callable[..., Any], spec: str, *args: Any, timeout: float = 180.0,
                         stop_when: Callable[[], bool] | None = None, **settings: Any) -> Outcome:
    """Like :func:`run_on_hosts` for a job expected to fail (but not to hang)."""
    import pytest

    hosts = layout(spec)
    outcome = start(fn, hosts, args, settings, timeout, stop_when)
    if outcome.timed_out:
        pytest.fail(f"the job on {spec} hung until the {timeout:g}s limit:\n{_dump(outcome, hosts)}", pytrace=False)
    return outcome


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    directory = sys.argv[1]
    rank = int(os.environ["RANK"])
    with open(os.path.join(directory, "fn.pkl"), "rb") as f:
        fn, args = pickle.load(f)
    result = fn(*args)
    tmp = os.path.join(directory, f"result.{rank}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(directory, f"result.{rank}.pkl"))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))  # tests/: the ranks import workers.*
    main()
