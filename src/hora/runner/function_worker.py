"""Entry point of the ranks started by :func:`hora.runner.run` with a Python function.

``python -m hora.runner.function_worker DIR``: loads ``DIR/fn.pkl`` (function, args, kwargs), runs it, and writes the
return value to ``DIR/result.<rank>.pkl`` (its rank at the end: an elastic worker's rank can change while it runs).
The directory is private to the launching user (0700); nothing here comes from the network.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys

from hora._runtime import context
from hora.config.launchers import detect


def main() -> None:
    # hora.runner.run(timeout=...) dumps stacks this way
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    directory = sys.argv[1]
    rank = detect().rank
    with open(os.path.join(directory, "fn.pkl"), "rb") as f:
        fn, args, kwargs = pickle.load(f)
    result = fn(*args, **kwargs)
    if context.is_initialized():
        rank = context.rank()
    tmp = os.path.join(directory, f"result.{rank}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(directory, f"result.{rank}.pkl"))


if __name__ == "__main__":
    main()
