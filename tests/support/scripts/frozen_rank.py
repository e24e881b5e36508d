"""Rank 1 freezes itself (SIGSTOP) in ``think_hard`` after a first allreduce; the others time out waiting for it in
the next one (run with a short HORA_OP_TIMEOUT_SECONDS)."""

import os
import signal

import numpy as np

import hora.numpy as hvd


def think_hard():
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen, as a rank stuck in a kernel or swapped out


hvd.init()
hvd.allreduce(np.ones(4), name="warm")
if hvd.rank() == 1:
    think_hard()
hvd.allreduce(np.ones(4), name="next")
