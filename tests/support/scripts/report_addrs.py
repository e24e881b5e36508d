"""Like report.py, plus where this rank's servers listen: ``ADDRS rank=R host=H rendezvous=A bind=B transport=T``."""

import numpy as np

import hora.numpy as hvd
from hora._runtime.context import current

hvd.init()
total = hvd.allreduce(np.array([hvd.rank()], np.int64), op=hvd.Sum)[0]
ctx = current()
rdv = ctx.bootstrap.addr if ctx.bootstrap is not None else "-"
print(f"RESULT rank={hvd.rank()} size={hvd.size()} local={hvd.local_rank()}/{hvd.local_size()} "
      f"cross={hvd.cross_rank()}/{hvd.cross_size()} sum={total}", flush=True)
print(f"ADDRS rank={hvd.rank()} host={ctx.hostname} rendezvous={rdv} bind={ctx.bind_addr} transport={ctx.transport}",
      flush=True)
hvd.shutdown()
