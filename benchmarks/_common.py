"""Helpers shared by the benchmark drivers in this folder (not a benchmark itself).

Sizes and formatting, the known test pattern, how each framework's ranks are started (``hora run``, ``mpirun``),
and :func:`run_ranks`, which runs one such command under a deadline and collects the ``HORA_BENCH {json}`` lines
that rank 0 prints.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MARKER = "HORA_BENCH "
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


# -- sizes and formatting ------------------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """'4K' -> 4096, '1M' -> 1048576, '512' -> 512 (bytes; binary units)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is not a number with an optional K/M/G suffix"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be positive")
    return value


def format_size(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def format_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def format_gbps(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def parse_counts(text: str, what: str = "--np") -> list[int]:
    """'2,4' -> [2, 4]; raises ArgumentTypeError for anything that is not a list of positive integers."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} takes a comma-separated list of integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{what} needs values of at least 1, got {text!r}")
    return values


def pattern(count: int, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """Small exact integers in float32 (0..126, scaled and shifted), so sums are exact and misplaced chunks show."""
    out = np.fmod(np.arange(count, dtype=np.float32), np.float32(127))
    if scale != 1.0:
        out *= np.float32(scale)
    if offset:
        out += np.float32(offset)
    return out


def machine() -> dict[str, Any]:
    """What the report says about the machine the numbers come from."""
    return {
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


# -- starting ranks ------------------------------------------------------------------------------------------------
def hora_command(n: int, transport: str | None = None) -> list[str]:
    """``hora run -np N`` (which also exports RANK, WORLD_SIZE, MASTER_ADDR/PORT for torch's env:// init)."""
    cmd = [sys.executable, "-m", "hora", "run", "-np", str(n)]
    return [*cmd, "--transport", transport] if transport else cmd


def torch_missing() -> str | None:
    """Why gloo cannot run here, or None."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    return None


def mpirun_command(n: int, extra_args: str) -> list[str] | str:
    """``mpirun -np N <extra>``, or why Open MPI cannot run here (no mpirun, no mpi4py)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return "mpirun is not on PATH (install Open MPI, e.g. the Debian package openmpi-bin)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install mpi4py)"
    return [mpirun, "-np", str(n), *extra_args.split()]


def mpi_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for mpirun: also allowed to run as root (containers, CI)."""
    env = dict(os.environ if base is None else base)
    env.update(MPI_ROOT_ENV)
    return env


def finish(notes: list[str], elapsed: float, json_path: str | None, record: dict[str, Any]) -> None:
    """The end of every benchmark's report: its notes, the total time, and (``--json``) ``record`` with both."""
    if notes:
        print("Notes:\n" + "\n".join(f"- {x}" for x in notes) + "\n")
    print(f"Total time: {elapsed:.0f} s")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({**record, "notes": notes, "elapsed_s": elapsed}, f, indent=1)
        print(f"Wrote {json_path}")


def emit(rank: int, record: dict[str, Any]) -> None:
    """Rank 0 reports one record to the driver."""
    if rank == 0:
        print(MARKER + json.dumps(record), flush=True)


def run_ranks(
    cmd: list[str],
    env: dict[str, str],
    timeout: float,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run a launcher command; return rank 0's records and an error note (None when it ended with a "done").

    The command runs in its own session; after ``timeout`` seconds its process group gets SIGTERM (``hora run``
    and ``mpirun`` pass it on to their ranks), and whatever is still alive when it ends gets SIGKILL.
    """
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    stderr_tail: collections.deque[str] = collections.deque(maxlen=30)
    drain = threading.Thread(target=lambda: stderr_tail.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, expire)
    timer.start()
    records: list[dict[str, Any]] = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            at = line.find(MARKER)
            if at < 0:
                continue
            rec = json.loads(line[at + len(MARKER) :])
            records.append(rec)
            if on_record is not None:
                on_record(rec)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    drain.join(timeout=5)
    if proc.returncode != 0 or not any(r["kind"] == "done" for r in records):
        tail = "\n".join("    " + s.rstrip() for s in list(stderr_tail)[-12:])
        why = f"stopped after --timeout {timeout:g}s" if expired.is_set() else f"exit code {proc.returncode}"
        return records, f"workers failed ({why}); last stderr lines:\n{tail}"
    return records, None


@contextlib.contextmanager
def busy_processes(k: int) -> Iterator[None]:
    """``k`` foreign processes that keep a core busy each (a data loader, another job), stopped by their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]
    try:
        if procs:
            time.sleep(0.5)  # let the scheduler see them
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
