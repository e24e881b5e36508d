"""The detached supervisor of a job started without ``--wait``: ``python -m hora.jobs._supervisor HOME NAME``.

It reads the (already validated) spec back from the job store and runs the job to its end; its own messages go to
the job's ``logs/job.log``, the ranks' output to the per-host logs.

``--parent PID`` ties the job to the process that started it (a tuning trial's Ray actor, :mod:`.ray_trial_node`):
when that process dies, the supervisor gets SIGTERM and stops the job as ``hora job stop`` does.
"""

from __future__ import annotations

import os
import signal
import sys

from hora._proc import set_parent_death_signal
from hora.errors import HoraError
from hora.jobs.lifecycle import JobSupervisor
from hora.jobs.spec import spec_from_dict
from hora.jobs.store import JobStore


def main() -> None:
    if sys.argv[3:4] == ["--parent"]:
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != int(sys.argv[4]):  # it died before the line above
            sys.exit(2)
    store = JobStore(sys.argv[1])
    try:
        record = store.get(sys.argv[2])
        JobSupervisor(spec_from_dict(record.spec), store, echo=False).run()
    except HoraError as exc:  # the store could not be read or written (a full disk): a sentence, not a traceback
        print(f"hora job: the supervisor of job {sys.argv[2]} stopped: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
