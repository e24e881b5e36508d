"""What ``hora job list / describe / logs / metrics`` print: readable text built from the job store and files."""

from __future__ import annotations

import heapq
import itertools
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from hora.errors import ConfigError, StorageError
from hora.jobs.export_spec import describe_lines
from hora.jobs.plan import JobPlan
from hora.jobs.records import AttemptResult, RankEnd, attempt_dir
from hora.jobs.spot import billable_seconds
from hora.jobs.states import SecondaryStatus
from hora.jobs.store import JobRecord, JobStore

__all__ = ["describe", "follow_logs", "job_table", "metrics_table", "plot_metrics", "read_logs", "summary",
           "system_metrics_table"]


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def job_table(records: list[JobRecord]) -> str:
    if not records:
        return "no jobs yet (hora job run SPEC starts one)"
    rows = [("NAME", "STATUS", "SECONDARY", "CREATED", "DURATION", "HOSTS")]
    for r in records:
        ray = r.spec.get("ray") or {}
        where = f" on ray:{ray['node_id'][:8]}" if ray.get("node_id") else ""
        rows.append((r.name, r.status, r.secondary_status, _when(r.created), _duration(r.duration),
                     f"{r.spec.get('instance_count', 1)}x{r.spec.get('processes_per_host', 1)}{where}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def summary(record: JobRecord) -> str:
    """The few lines printed when a job ends."""
    attempts = f"{record.attempts} attempt{'s' if record.attempts != 1 else ''}"
    lines = [
        f"job {record.name}: {record.status} ({record.secondary_status}) after {_duration(record.duration)}, {attempts}"
    ]
    if record.failure_reason:
        lines.append("failure reason:")
        lines += [f"  {line}" for line in record.failure_reason.splitlines()]
    for kind, where in sorted(record.artifacts.items()):
        lines.append(f"{kind + ':':8} {where}")
    lines.append(f"{'logs:':8} {Path(record.job_dir) / 'logs'}  (hora job logs {record.name})")
    return "\n".join(lines)


def describe(store: JobStore, name: str) -> str:
    r = store.get(name)
    spec = r.spec
    lines = [
        f"Name:              {r.name}",
        f"Status:            {r.status}",
        f"Secondary status:  {r.secondary_status}",
        f"Created:           {_when(r.created)}",
        f"Started:           {_when(r.started)}",
        f"Ended:             {_when(r.ended)}",
        f"Duration:          {_duration(r.duration)}",
        *(_run_lines(r) if spec.get("kind") == "run" else _job_lines(store, r)),
        f"Job directory:     {r.job_dir}",
    ]
    for ch in spec.get("inputs", {}).values():
        lines.append(f"Channel {ch['name']}: {ch['uri']} ({ch['input_mode']}, {ch['distribution']})")
    lines += describe_lines(spec)
    if r.exit_code is not None:
        lines.append(f"Exit code:         {r.exit_code}")
    if r.failure_reason:
        lines.append("Failure reason:")
        lines += [f"  {line}" for line in r.failure_reason.splitlines()]
    for kind, where in sorted(r.artifacts.items()):
        lines.append(f"Artifact {kind}: {where}")
    lines += _rank_outcomes(r)
    metrics = store.metrics(name)
    if metrics:
        names = sorted({m[0] for m in metrics})
        lines.append("Final metrics:     " + ", ".join(
            f"{n}={next(m[1] for m in reversed(metrics) if m[0] == n):g}" for n in names))
    lines.append("Status history:")
    for t, status, secondary, message in store.transitions(name):
        lines.append(f"  {_when(t)}  {status:10} {secondary:18} {message.splitlines()[0] if message else ''}".rstrip())
    return "\n".join(lines)


def _job_lines(store: JobStore, r: JobRecord) -> list[str]:
    spec = r.spec
    return [
        f"Attempts:          {r.attempts} (max_retry_attempts {spec.get('max_retry_attempts', 0)})",
        f"Entry point:       {spec['entry_point']} in {spec['source_dir']}",
        f"Hosts:             {spec['instance_count']} x {spec['processes_per_host']} process(es), "
        f"distribution {spec['strategy']}",
        *_network(r),
        *_ray_node(r),
        f"Hyperparameters:   {json.dumps(spec.get('hyperparameters', {}), sort_keys=True)}",
        f"Max run:           {spec['max_run']:g}s",
        *_spot_lines(store, r),
    ]


def _run_lines(r: JobRecord) -> list[str]:
    """A run of hora run kept with --record (hora.jobs.run_record)."""
    ranks = r.spec.get("ranks") or []
    return [
        "Kind:              hora run (kept with --record)",
        f"Command:           {r.spec.get('entry_point', '')}",
        f"Hosts:             {', '.join(r.host_names)}; {len(ranks)} rank(s)",
    ]


def _ray_node(r: JobRecord) -> list[str]:
    """A tuning trial run on a Ray node and mirrored here (hora.jobs.ray_trials): where it ran."""
    ray = r.spec.get("ray")
    if not ray:
        return []
    want = ", ".join(f"{k} {v:g}" for k, v in sorted((ray.get("resources") or {}).items()))
    if not ray.get("node_id"):
        return [f"Ray node:          not placed yet (cluster {ray['address']}, asking for {want})"]
    return [f"Ray node:          {ray['node_ip']} ({ray['hostname']}), node id {ray['node_id']}; cluster "
            f"{ray['address']}, {want}",
            f"On the node:       {ray['node_job_dir']} (removed once mirrored here)"]


def _spot_lines(store: JobStore, r: JobRecord) -> list[str]:
    """Managed spot: max_wait, the reclaims, and SageMaker's training and billable seconds."""
    if not r.spec.get("use_spot_instances"):
        return []
    steps = store.transitions(r.name)
    reclaims = sum(1 for _, _, secondary, _ in steps if secondary == SecondaryStatus.Interrupted)
    lines = [f"Managed spot:      max_wait {r.spec['max_wait']:g}s, {reclaims} interruption(s)"]
    if r.started is not None:
        training = (r.ended or time.time()) - r.started
        billable = billable_seconds(steps, r.ended)
        saving = f" ({(1 - billable / training) * 100:.1f}% less than the training time)" if training > 0 else ""
        lines.append(f"Training time:     {int(training)}s; billable time {int(billable)}s{saving}")
    return lines


def _network(r: JobRecord) -> list[str]:
    """How the hosts got their addresses (from the plan the ranks were started with; nothing before that)."""
    try:
        plan = JobPlan.read(r.job_dir)
    except OSError:
        return []
    except StorageError as exc:  # a plan hora did not write: say so, describe the rest
        return [f"Network:           unknown: {exc}"]
    where = ", ".join(f"{h}={a}" for h, a in zip(plan.hosts, plan.addresses))
    return [f"Network:           {plan.network} ({where}; interface {plan.interface})"]


def _rank_outcomes(r: JobRecord) -> list[str]:
    """The last attempt's ranks: host, pid and how each script ended."""
    try:
        return _rank_lines(r, AttemptResult.read(r.job_dir, r.attempts))
    except OSError:
        return []
    except ValueError as exc:
        where = attempt_dir(r.job_dir, r.attempts)
        return [f"Ranks (attempt {r.attempts}): unknown: {where} holds records hora did not write ({exc})"]


def _rank_lines(r: JobRecord, result: AttemptResult) -> list[str]:
    pph = int(r.spec.get("processes_per_host", 1))
    lines = [f"Ranks (attempt {r.attempts}):", f"  {'rank':>4}  {'host':8}  {'pid':>7}  outcome"]
    for rank, code in enumerate(result.returncodes):
        try:
            end: RankEnd | None = RankEnd.read(RankEnd.path(r.job_dir, r.attempts, rank))
        except OSError:
            end = None
        if end is not None:
            code = end.returncode
        if code is None:
            outcome = "unknown"
        elif code < 0:
            try:
                outcome = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                outcome = f"killed by signal {-code}"
        else:
            outcome = f"exit code {code}"
        pid = end.pid if end else ""
        lines.append(f"  {rank:>4}  {'algo-' + str(rank // pph + 1):8}  {pid:>7}  {outcome}")
    return lines


def _log_files(record: JobRecord, host: str | None) -> list[Path]:
    logs = Path(record.job_dir) / "logs"
    hosts = record.host_names
    if host is not None:
        if host not in hosts:
            raise ConfigError(f"job {record.name} has no host {host!r}; its hosts are {', '.join(hosts)}")
        hosts = [host]
    return [logs / f"{h}.log" for h in hosts]


def read_logs(store: JobStore, name: str, host: str | None = None) -> Iterator[str]:
    """Every host's log lines merged in time order (each line starts with its UTC timestamp; each file is in time
    order already), read as they are consumed: a job's logs may be far larger than memory should hold."""
    files = [f for f in _log_files(store.get(name), host) if f.is_file()]
    yield from heapq.merge(*(_in_order(_lines(f)) for f in files), key=lambda line: line[:24])


#: Lines a host's log may be out of order by: its ranks stamp a line, then append it, so two ranks' lines can land a
#: moment out of order; this many are held to put them back (one host's order is kept within a millisecond).
_REORDER = 4096


def _in_order(lines: Iterator[str]) -> Iterator[str]:
    held: list[tuple[str, int, str]] = []
    for n, line in enumerate(lines):
        heapq.heappush(held, (line[:24], n, line))
        if len(held) > _REORDER:
            yield heapq.heappop(held)[2]
    while held:
        yield heapq.heappop(held)[2]


def _lines(path: Path) -> Iterator[str]:
    with open(path, errors="replace") as f:
        for line in f:
            yield line.rstrip("\n")


def follow_logs(store: JobStore, name: str, host: str | None = None, poll: float = 0.5) -> Iterator[str]:
    """New log lines as they are written, until the job has ended and its logs are drained."""
    offsets: dict[Path, int] = {}
    partial: dict[Path, str] = {}
    while True:
        from hora.jobs.api import reconcile

        done = reconcile(store, store.get(name)).done  # read before the files: nothing written before the end is missed
        batch: list[str] = []
        for f in _log_files(store.get(name), host):
            try:
                with open(f, errors="replace") as fh:
                    fh.seek(offsets.get(f, 0))
                    data = fh.read()
                    offsets[f] = fh.tell()
            except FileNotFoundError:
                continue
            *complete, partial[f] = (partial.get(f, "") + data).split("\n")
            batch += complete
        yield from sorted(batch, key=lambda line: line[:24])
        if done:
            return
        time.sleep(poll)


def metrics_table(store: JobStore, name: str) -> Iterator[str]:
    """The job's metric values as table lines, read from the store as they are printed."""
    store.get(name)
    names = store.metric_names(name)
    if not names:
        yield f"job {name} has no metric values (metric_definitions match no log line yet)"
        return
    widths = (12, max(6, *map(len, names)), 12, 8, 4, 7)

    def row(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    yield row(("TIME", "METRIC", "VALUE", "HOST", "RANK", "ATTEMPT"))
    for metric, value, ts, host, rank, attempt in store.iter_metrics(name):
        stamp = time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
        yield row((stamp, metric, f"{value:g}", host, str(rank), str(attempt)))


def system_metrics_table(store: JobStore, name: str) -> Iterator[str]:
    """The job's system metric samples (every host's CPU, memory, network, disk) as table lines, in time order."""
    record = store.get(name)
    rows = store.iter_system_metrics(name)
    first = next(rows, None)
    if first is None:
        off = record.spec.get("system_monitor_interval_millis", 0) is None
        yield f"job {name} has no system metrics" + (
            " (its profiler_config disables them)" if off else " (yet: each host writes its samples every few seconds)")
        return
    widths = (12, 8, 34, 14)

    def row(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    yield row(("TIME", "HOST", "METRIC", "VALUE"))
    for host, ts, metric, value in itertools.chain([first], rows):
        stamp = time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
        yield row((stamp, host, metric, f"{value:.10g}"))


def plot_metrics(store: JobStore, name: str, path: str, system: bool = False) -> str:
    """One subplot per metric, one line per host/rank (with ``system``: per host, the system metrics), x = seconds
    since the job started."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: pip install -c constraints.txt -e '.[jobs-plot]' in hora's checkout"
        ) from None
    record = store.get(name)
    rows = store.metrics(name) if not system else [
        (metric, value, ts, host, 0, 0) for host, ts, metric, value in store.iter_system_metrics(name)]
    if not rows:
        raise ConfigError(f"job {name} has no {'system metrics' if system else 'metric values'} to plot")
    names = sorted({r[0] for r in rows})
    t0 = record.started or min(r[2] for r in rows)
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 3 * len(names)), squeeze=False)
    for ax, metric in zip(axes[:, 0], names):
        series: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for m, value, ts, host, rank, _ in rows:
            if m == metric:
                series.setdefault((host, rank), []).append((ts - t0, value))
        for (host, rank), points in sorted(series.items()):
            label = host if system else f"{host} rank {rank}"
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=label)
        ax.set_title(metric)
        ax.set_xlabel("seconds since start")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
