"""The detached supervisor of a tuning job: ``python -m hora.jobs._tuning_supervisor HOME NAME``.

It reads the tuning job's config back from ``<HOME>/tuning/NAME/`` and runs it to its end (:mod:`.tuning`); its
own errors go to that directory's ``supervisor.err``.
"""

from __future__ import annotations

import os
import sys

from hora.errors import HoraError
from hora.jobs.store import JobStore
from hora.jobs.tuning import TuningSupervisor
from hora.jobs.tuning_store import TuningStore


def main() -> None:
    tstore = TuningStore(JobStore(sys.argv[1]))
    try:
        tstore.record_supervisor(sys.argv[2], os.getpid())
        TuningSupervisor(tstore, sys.argv[2]).run()
    except HoraError as exc:
        print(f"hora job tune: the supervisor of tuning job {sys.argv[2]} stopped: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
