"""A rank that records its pid and a child's pid, then waits forever inside a collective (or sleeps)."""

import os
import subprocess
import sys
import time

directory, mode = sys.argv[1], sys.argv[2]
child = subprocess.Popen(["sleep", "300"])
rank = os.environ["HORA_RANK"]
if mode == "stubborn":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(directory, f"pids.{rank}.tmp"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.replace(os.path.join(directory, f"pids.{rank}.tmp"), os.path.join(directory, f"pids.{rank}"))
if mode == "collective":
    import numpy as np

    import hora.numpy as hvd

    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(1), name="only-rank-0")  # waits for the others forever
time.sleep(300)
