"""Recovery of an elastic job: the time from a worker's SIGKILL to the survivors' first completed collective after
the reset, and the steps lost, at N workers on loopback "hosts" (127.0.0.2, 127.0.0.3, ...) of this machine.

    python benchmarks/elastic_recovery.py                    # N=4, 5 runs, a commit every step
    python benchmarks/elastic_recovery.py --np 4 --runs 10 --commit-every 5

Each run is ``hora run -np N -H 127.0.0.2:1,... --min-np 1`` of this file in ``--worker`` mode: every step is one
1 MiB allreduce, then ``state.commit()`` every ``--commit-every`` steps; at step 22 the last worker writes the time
and SIGKILLs itself. Rank 0 of the next round writes the time its first allreduce after the reset completed. The
recovery time is the difference (one machine's clock); the steps lost are the steps rank 0 did twice.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KILL_STEP = 22


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    import hora.numpy as hvd

    out = Path(args.out)
    hvd.init()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    buf = np.zeros(1 << 18, np.float32)  # 1 MiB
    victim = os.environ["HORA_ELASTIC_SLOT"] == f"127.0.0.{args.np + 1}:0"
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])

    @hvd.elastic.run
    def train(state: object) -> None:
        first = bool(resets)
        while state.step < args.steps:  # type: ignore[attr-defined]
            if victim and state.step == KILL_STEP:  # type: ignore[attr-defined]
                (out / "killed").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce_(buf, op=hvd.Sum, name="grad")
            if first and hvd.rank() == 0:
                (out / "recovered").write_text(repr(time.time()))
                first = False
            if hvd.rank() == 0:
                with (out / "steps").open("a") as f:
                    f.write(f"{state.step}\n")  # type: ignore[attr-defined]
            state.step += 1  # type: ignore[attr-defined]
            if state.step % args.commit_every == 0:  # type: ignore[attr-defined]
                state.commit()  # type: ignore[attr-defined]

    train(state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--commit-every", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    hosts = ",".join(f"127.0.0.{i + 2}:1" for i in range(args.np))
    recoveries, lost = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            command = [
                sys.executable,
                "-m",
                "hora",
                "run",
                "-np",
                str(args.np),
                "-H",
                hosts,
                "--min-np",
                "1",
                sys.executable,
                __file__,
                "--worker",
                "--out",
                out,
                "--np",
                str(args.np),
                "--steps",
                str(args.steps),
                "--commit-every",
                str(args.commit_every),
            ]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                sys.exit(f"the elastic job failed:\n{done.stderr[-3000:]}")
            recoveries.append(float(Path(out, "recovered").read_text()) - float(Path(out, "killed").read_text()))
            steps = Path(out, "steps").read_text().split()
            lost.append(len(steps) - len(set(steps)))
    print(
        f"N={args.np} elastic recovery, a commit every {args.commit_every} step(s), {args.runs} runs: SIGKILL -> "
        f"first collective after the reset median {statistics.median(recoveries):.3f} s (min {min(recoveries):.3f}, "
        f"max {max(recoveries):.3f}); steps lost per failure {sorted(lost)}"
    )


if __name__ == "__main__":
    main()
