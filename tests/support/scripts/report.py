"""Prints each rank's view of the topology and the sum of the ranks (an allreduce across the job)."""

import numpy as np

import hora.numpy as hvd

hvd.init()
total = hvd.allreduce(np.array([hvd.rank()], np.int64), op=hvd.Sum)[0]
print(f"RESULT rank={hvd.rank()} size={hvd.size()} local={hvd.local_rank()}/{hvd.local_size()} "
      f"cross={hvd.cross_rank()}/{hvd.cross_size()} sum={total}", flush=True)
hvd.shutdown()
