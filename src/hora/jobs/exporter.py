"""The job supervisor's exporter: while a job runs, a thread follows the job store's new metric values (by rowid,
every :data:`POLL_SECONDS`) and the hosts' TensorBoard directories, and feeds them to TensorBoard
(:mod:`.tb_export`) and MLflow (:mod:`.mlflow_export`); when the job has ended it exports once more, with the
job's status, failure reason and artifacts.

A value's step is its index in its series: the values of one metric from one rank, in the order the rank printed
them (over every attempt). Rank 0's series keeps the metric's name; another rank's is ``<name>/rank<r>``
(:func:`series_key`), so a script that prints its metrics on rank 0 only gets plain names, and no two ranks'
values are ever mixed into one series. The hosts' system metrics (CPU, memory, network, disk: docs/jobs.md) go
too, as ``system/<host>/<name>`` series, stepped the same way.

An export failure never changes the job's outcome: it is said once in ``logs/job.log`` (and again if it is still
failing at the end); metric values MLflow refused are kept and sent again at the next poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from hora.jobs.sagemaker_env import HostLayout
from hora.jobs.spec import JobSpec
from hora.jobs.store import JobStore

if TYPE_CHECKING:  # imported when an export starts: they import tensorboard and mlflow
    from hora.jobs.mlflow_export import MlflowExport
    from hora.jobs.tb_export import TensorBoardExport

__all__ = ["FINISH_SECONDS", "POLL_SECONDS", "JobExporter", "series_key", "system_key"]

POLL_SECONDS = 2.0
#: How long the supervisor waits for the last export (artifacts to a remote MLflow may take a while) before it
#: gives up on it and says so.
FINISH_SECONDS = 300.0
MAX_PENDING = 1_000_000  # metric values kept for an MLflow that refuses them (~100 MB at most)


def series_key(name: str, rank: int) -> str:
    """The TensorBoard tag and MLflow key of metric ``name``'s values from ``rank``."""
    return name if rank == 0 else f"{name}/rank{rank}"


def system_key(host: str, name: str) -> str:
    """The TensorBoard tag and MLflow key of a host's system metric (``system/algo-1/cpu_percent``)."""
    return f"system/{host}/{name}"


class JobExporter:
    """Exports one job to TensorBoard and/or MLflow as its spec asks; :meth:`start` it when the job starts and
    :meth:`finish` it when the job's end is recorded."""

    def __init__(self, spec: JobSpec, store: JobStore, layouts: list[HostLayout],
                 say: Callable[[str], None]) -> None:
        self.spec = spec
        self.store = store
        self.layouts = layouts
        self.say = say
        self._rowid = 0
        self._system_since: dict[str, float] = {}  # system/<host>/<name> -> its last sample exported
        self._steps: dict[tuple[str, int], int] = {}
        self._pending: list[tuple[str, float, int, float]] = []  # for MLflow, until it takes them
        self._failing: set[str] = set()  # what failed and was said (said again only once it recovered)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tb: TensorBoardExport | None = None
        self._ml: MlflowExport | None = None

    @classmethod
    def start_for(cls, spec: JobSpec, store: JobStore, layouts: list[HostLayout],
                  say: Callable[[str], None]) -> JobExporter | None:
        """A started exporter when the spec exports anything, else None; a failure to start is said, not raised."""
        if spec.tensorboard_output_config is None and spec.mlflow is None:
            return None
        exporter = cls(spec, store, layouts, say)
        try:
            exporter.start()
        except Exception as exc:
            say(f"export: cannot start ({type(exc).__name__}: {exc}); the job runs without it")
            return None
        return exporter

    def start(self) -> None:
        from hora.jobs.mlflow_export import MlflowExport
        from hora.jobs.tb_export import TensorBoardExport

        spec = self.spec
        if spec.tensorboard_output_config is not None:
            job_dir = self.store.job_dir(spec.job_name)
            self._tb = TensorBoardExport(spec.tensorboard_output_config, spec.job_name, job_dir, self.layouts)
            self._tb.prepare()
            self.say(f"TensorBoard: {', '.join(map(str, self._tb.dirs))} synced to "
                     f"{spec.tensorboard_output_config.s3_output_path}; metrics as the run {spec.job_name}/ there")
        if spec.mlflow is not None:
            self._ml = MlflowExport(spec.mlflow, spec)
            self.say(f"MLflow: run {spec.job_name} in experiment {spec.mlflow.experiment!r} at "
                     f"{spec.mlflow.tracking_uri}")
        self._thread = threading.Thread(target=self._run, name=f"hora-export-{spec.job_name}", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Export the job's end (its record must be final) and wait for it, at most :data:`FINISH_SECONDS`."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(FINISH_SECONDS)
        if self._thread.is_alive():
            self.say(f"export: the last export did not end within {FINISH_SECONDS:g}s; left unfinished")

    # -- the thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._poll()
        self._poll()
        self._end()

    def _guard(self, what: str, action: Callable[[], object]) -> bool:
        try:
            action()
        except Exception as exc:
            if what not in self._failing:
                self._failing.add(what)
                self.say(f"export: {what} failed: {type(exc).__name__}: {exc}")
            return False
        if what in self._failing:
            self._failing.discard(what)
            self.say(f"export: {what} works again")
        return True

    def _new_points(self) -> list[tuple[str, float, int, float]]:
        points = []
        while True:
            rows = self.store.metrics_after(self.spec.job_name, self._rowid)
            for rowid, name, value, timestamp, _host, rank, _attempt in rows:
                step = self._steps.get((name, rank), 0)
                self._steps[(name, rank)] = step + 1
                points.append((series_key(name, rank), float(value), step, float(timestamp)))
                self._rowid = rowid
            if len(rows) < 10_000:
                return points

    def _system_points(self) -> list[tuple[str, float, int, float]]:
        """The hosts' system metric samples read since the last poll, as ``system/<host>/<name>`` series (a host
        stores its samples in batches, so each series is followed from its own last sample)."""
        points = []
        since = min(self._system_since.values(), default=0.0)
        for host, timestamp, name, value in self.store.iter_system_metrics(self.spec.job_name, since):
            key = system_key(host, name)
            if timestamp <= self._system_since.get(key, 0.0):
                continue
            self._system_since[key] = timestamp
            step = self._steps.get((key, 0), 0)
            self._steps[(key, 0)] = step + 1
            points.append((key, float(value), step, float(timestamp)))
        return points

    def _poll(self) -> None:
        points: list[tuple[str, float, int, float]] = []

        def read() -> None:
            points.extend(self._new_points())
            points.extend(self._system_points())

        self._guard("reading the job's metrics", read)
        tb, ml = self._tb, self._ml
        if tb is not None:
            self._guard("writing TensorBoard scalars", lambda: tb.scalars(points))
            self._guard("syncing the TensorBoard files", tb.poll)
        if ml is not None:
            self._pending.extend(points)
            del self._pending[: max(0, len(self._pending) - MAX_PENDING)]
            opened = self._guard("creating the MLflow run", lambda: ml.open(self.store.get(self.spec.job_name).started))
            if opened and self._pending and self._guard("logging metrics to MLflow", lambda: ml.metrics(self._pending)):
                self._pending = []

    def _end(self) -> None:
        tb, ml = self._tb, self._ml
        if tb is not None:
            self._guard("syncing the TensorBoard files at the end", tb.close)
        if ml is not None and ml.run_id is not None:
            if self._pending:
                self.say(f"export: {len(self._pending)} metric value(s) never reached MLflow")
            self._guard("ending the MLflow run", lambda: ml.end(self.store.get(self.spec.job_name)))

