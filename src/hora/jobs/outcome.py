"""Judging an attempt and keeping what it made: the master's record of hora run's outcome, the failure reason
(SageMaker's ``FailureReason``: a script's own output/failure file, else the rank that failed first with its
traceback), and the artifacts archived from every host."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tarfile
from pathlib import Path

from hora.errors import HoraError, HostStartError, StorageError
from hora.jobs import channels
from hora.jobs.cluster import host_index_of_rank
from hora.jobs.records import AttemptResult, HostReport, MasterRecord, RankEnd
from hora.jobs.sagemaker_env import HostLayout, host_layout
from hora.runner.result import Failure, RunResult, root_cause

__all__ = ["TRACEBACK_LINES", "archive", "describe_code", "failure_reason", "master_result", "merge_tar"]

TRACEBACK_LINES = 15


def traceback_tail(lines: list[str]) -> list[str]:
    """The last traceback in a rank's stderr (at most the last lines of it), else its last lines."""
    start = max(
        (i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
        default=None,
    )
    chosen = lines[start:] if start is not None else lines
    return chosen[-TRACEBACK_LINES:]


def describe_code(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {128 - code})"
    return f"exit code {code}"


def failure_reason(job_dir: Path, hosts: list[str], processes_per_host: int, attempt: int,
                   result: RunResult) -> tuple[str, int | None]:
    """(reason, exit code): a failure file written by the script wins; else the first failing host and rank, its
    real exit code and the tail of its traceback."""
    for host in hosts:
        f = host_layout(job_dir, host).failure_file
        if f.is_file():
            text = f.read_text(errors="replace").strip()
            if text:
                rc = result.root_cause
                code = rc.exit_code if rc is not None else result.exit_code
                return f"AlgorithmError: {host} wrote output/failure:\n{text[:4096]}", code
    ends = RankEnd.read_all(job_dir, attempt)
    rc = _root_cause_with_tails(result, ends)
    if rc is None:
        return f"AlgorithmError: the ranks ended with exit code {result.exit_code}", result.exit_code
    if rc.label:  # a parameter server of hora run's, not a rank
        lines = [f"AlgorithmError: {rc.label} (pid {rc.pid}) failed first: {describe_code(rc.returncode)}; the "
                 "workers that needed it were stopped"]
        tb = traceback_tail(list(rc.tail))
        lines += ["last lines of its stderr:", *[f"  {t}" for t in tb]] if tb else []
        return "\n".join(lines), rc.exit_code
    host = hosts[host_index_of_rank(rc.rank, processes_per_host)]
    end = ends.get(rc.rank)
    tail, code, pid = (end.tail, end.returncode, end.pid or rc.pid) if end else ((), rc.returncode, rc.pid)
    if end is not None and end.ps_task:  # the host's parameter server ended while the job ran (_entry.py)
        lines = [f"AlgorithmError: host {host}, the {end.ps_task} (pid {pid}) failed first: "
                 f"{describe_code(code)}; the host's worker (rank {rc.rank}) was stopped"]
    elif rc.stopped:  # the rank the others waited for until the stall shutdown (hora.runner.result.root_cause)
        lines = [f"AlgorithmError: host {host}, rank {rc.rank} (pid {pid}) kept the other ranks waiting until the "
                 f"stall shutdown, then was stopped ({describe_code(code)}): {rc.reason}"]
    else:
        lines = [f"AlgorithmError: host {host}, rank {rc.rank} (pid {pid}) failed first: {describe_code(code)}"
                 + (f": {rc.reason}" if rc.reason else "")]  # its host failed (hora run: a lost SSH connection)
    tb = traceback_tail(list(tail))
    if tb:
        lines.append("last lines of its stderr:")
        lines += [f"  {t}" for t in tb]
    return "\n".join(lines), (128 - code if code < 0 else code)


def _root_cause_with_tails(result: RunResult, ends: dict[int, RankEnd]) -> Failure | None:
    """hora run's root-cause choice, fed with what it cannot see here: each script's stderr tail and exit time
    (the wrappers record them), so a rank that only reacted to another's death (PeerLostError, ShutdownError)
    is not blamed."""
    if not all(f.rank in ends for f in result.failures):  # exit times must all come from the same clock
        return result.root_cause
    return root_cause([
        dataclasses.replace(f, tail=list(ends[f.rank].tail), when=ends[f.rank].ended) for f in result.failures
    ])


def merge_tar(dirs: list[Path], archive: Path) -> None:
    """One .tar.gz of several hosts' directories; on a name clash the earlier host (algo-1 first) wins."""
    chosen: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.rglob("*")):
            if path.is_file() or path.is_symlink():
                chosen.setdefault(path.relative_to(d).as_posix(), path)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.part")  # renamed when whole: no truncated archive is ever left
    try:
        with tarfile.open(partial, "w:gz") as tar:
            for name, path in sorted(chosen.items()):
                tar.add(path, arcname=name, recursive=False)
        os.replace(partial, archive)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StorageError(f"writing {archive} failed: {exc.strerror or exc}") from exc


def _full_disk(path: Path) -> str:
    """A note when the file system of ``path`` has (next to) no space left: why a record may be missing."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= 1 << 20:
        return ""
    return f" (the file system of {path} is full: {free} bytes free; free space there)"


def master_result(
    job_dir: Path, hosts: list[str], world_size: int, attempt: int, codes: dict[str, int], interrupted: int | None
) -> RunResult:
    """hora run's outcome as the master host recorded it (``hora/attempt-N/master.json``); HostStartError when the
    master could not start hora run or died without a record (with what the other hosts reported).
    ``interrupted``: the signal the supervisor forwarded to the master, if any."""
    try:
        record = MasterRecord.read(job_dir, attempt)
    except (OSError, ValueError) as exc:
        written = "without reporting" if isinstance(exc, OSError) else f"with a record hora cannot read ({exc})"
        record = MasterRecord(
            error=f"the master host {hosts[0]} ended ({describe_code(codes[hosts[0]])}) {written} how hora run "
            f"ended; the ranks it had started were stopped{_full_disk(job_dir)}"
        )
    if record.result is None:
        if interrupted is not None:
            return RunResult(128 + interrupted, [None] * world_size, None, [], interrupted, False, {}, "")
        problems = [record.error or "unknown"]
        for host in hosts[1:]:
            try:
                problems.append(HostReport.read(job_dir, attempt, host).error)
            except (OSError, ValueError):
                if codes.get(host) not in (0, None):
                    problems.append(f"{host}'s agent ended with {describe_code(codes[host])}")
        raise HostStartError("the job's hosts failed:\n  " + "\n  ".join(problems))
    r = record.result
    got = r.interrupted if r.interrupted is not None else interrupted
    AttemptResult(tuple(r.returncodes), r.exit_code, got).write(job_dir, attempt)
    return dataclasses.replace(r, root_cause=root_cause(r.failures), interrupted=interrupted)


def archive(
    job_dir: Path, layouts: list[HostLayout], output_path: str | None, job_name: str
) -> tuple[dict[str, str], str | None]:
    """model/ -> model.tar.gz and output/data -> output.tar.gz of every host (``layouts``, master first), written
    to ``<output_path>/<job>/output/`` (the job's own ``output/`` without an output_path). Returns (artifact ->
    where it went, the problem if archiving failed). An archive is written under a temporary name and renamed when
    whole: one that failed (a full disk) is removed, never left truncated."""
    staging = job_dir / "hora" / "archives"
    artifacts: dict[str, str] = {}
    try:
        merge_tar([layout.model_dir for layout in layouts], staging / "model.tar.gz")
        merge_tar([layout.output_data_dir for layout in layouts], staging / "output.tar.gz")
        dest = f"{output_path.rstrip('/')}/{job_name}/output" if output_path else str(job_dir / "output")
        for name in ("model.tar.gz", "output.tar.gz"):
            artifacts[name.split(".")[0]] = channels.upload(staging / name, dest)
    except (HoraError, OSError) as exc:
        return artifacts, f"archiving the artifacts failed: {exc}"
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # uploaded (or failed): the staged copies only take space
    return artifacts, None
