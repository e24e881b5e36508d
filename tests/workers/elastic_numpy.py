"""An elastic numpy script for the elastic launcher's tests. Each step allreduces ``rank + 1`` and adds it to the
state; rank 0 appends ``step size`` to ``OUT/log`` for every step it completes. ``--kill SLOT:STEP`` makes that
slot's worker SIGKILL itself after the step's allreduce (once: a marker file stops a restarted slot from dying
again); ``--term SLOT:STEP`` sends it SIGTERM there instead (a preemption), ``--freeze SLOT:STEP`` SIGSTOP;
``--hold-at STEP --hold-size N`` makes the ranks wait at that step, committing, until the job has N ranks
(a host added to the discovery output); ``--die-at-start HOST`` makes a worker of that host started for a later
round exit with 3 before ``init()`` (it dies while the round it was started for is being assembled)."""

import argparse
import os
import signal
import time

import numpy as np

import hora.numpy as hvd

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", required=True)
p.add_argument("--kill", action="append", default=[])
p.add_argument("--term", action="append", default=[], help="SLOT:STEP: that worker gets SIGTERM during the step")
p.add_argument("--freeze", default="", help="SLOT:STEP: that worker stops itself (SIGSTOP) in the step")
p.add_argument("--hold-at", type=int, default=-1)
p.add_argument("--hold-size", type=int, default=0)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--die-at-start", default="", help="HOST: its workers started after round 1 exit before init()")
args = p.parse_args()

slot_host = os.environ["HORA_ELASTIC_SLOT"].rpartition(":")[0]
if args.die_at_start and slot_host == args.die_at_start and os.environ["HORA_ELASTIC_ROUND"] != "1":
    raise SystemExit(3)
hvd.init()
state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, total=np.zeros(2))
slot = os.environ["HORA_ELASTIC_SLOT"]
kills = {k.rpartition(":")[0]: int(k.rpartition(":")[2]) for k in args.kill}
terms = {k.rpartition(":")[0]: int(k.rpartition(":")[2]) for k in args.term}
freeze_slot, _, freeze_step = args.freeze.rpartition(":")


def think_very_hard():
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen, as a rank stuck in a kernel or swapped out


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        while state.step == args.hold_at and hvd.size() < args.hold_size:
            time.sleep(0.05)
            state.commit()
        state.total = state.total + hvd.allreduce(np.full(2, hvd.rank() + 1.0), op=hvd.Sum, name="g")
        marker = os.path.join(args.out, f"killed-{slot}-{state.step}")
        if kills.get(slot) == state.step and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if slot == freeze_slot and state.step == int(freeze_step):
            think_very_hard()
        if terms.get(slot) == state.step:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice: hora lets the step finish
        if hvd.rank() == 0:
            with open(os.path.join(args.out, "log"), "a") as f:
                f.write(f"{state.step} {hvd.size()}\n")
        state.step += 1
        time.sleep(args.step_sleep)
        state.commit()


train(state)
print(f"finished rank {hvd.rank()} of {hvd.size()} max_size {hvd.max_size()} total {state.total[0]:g}", flush=True)
