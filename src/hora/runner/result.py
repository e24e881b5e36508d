"""How a job ended: each rank's failure, the root cause among them, and the report hora run prints (torchrun's
failure table)."""

from __future__ import annotations

import dataclasses
import re
import signal
from dataclasses import dataclass, field

from hora.runner.stacks import where

__all__ = ["Failure", "RunResult", "root_cause"]


@dataclass
class Failure:
    rank: int
    host: str
    pid: int
    returncode: int
    tail: list[str]
    when: float
    stopped: bool = False  # hora run's own stop signal ended it
    reason: str = ""  # why, when the rank's host failed rather than the rank (a lost SSH connection, say)
    label: str = ""  # not a rank: "parameter server 0" (``rank`` is then its output key, below 0)

    @property
    def who(self) -> str:
        return self.label or f"rank {self.rank}"

    @property
    def exit_code(self) -> int:
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def describe(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"killed by {name}"
        return f"exit code {self.returncode}"


@dataclass
class RunResult:
    """What a job ended with. ``exit_code`` is 0, or the root cause's exit code (128+N for signal N)."""

    exit_code: int
    returncodes: list[int | None]
    root_cause: Failure | None = None
    failures: list[Failure] = field(default_factory=list)
    interrupted: int | None = None
    timed_out: bool = False
    lines: dict[int, dict[str, list[str]]] = field(default_factory=dict)
    job_id: str = ""
    reason: str = ""  # why the job ended when no rank's failure says it (an elastic job's reset limit, say)
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its threads' stacks, taken before it was stopped
    stacks_saved: str = ""  # where the full dumps were kept

    def report(self) -> str:
        """A human-readable account of the failure (empty when the job succeeded)."""
        if self.timed_out:
            head = (
                "hora run: the job exceeded its time limit; every rank's stacks were taken (where each was: below) "
                "and the ranks were killed."
            )
        elif self.interrupted is not None:
            head = f"hora run: interrupted by {signal.Signals(self.interrupted).name}; stopped every rank."
        elif self.reason:
            head = f"hora run: {self.reason}"
        elif self.root_cause is None:
            return ""
        elif self.root_cause.stopped:  # the rank the others waited for (a stall), stopped by hora run
            head = (
                f"hora run: the other ranks waited for rank {self.root_cause.rank} until the stall shutdown (the "
                "root cause, below); every rank was stopped."
            )
        else:
            head = (
                f"hora run: {self.root_cause.who} failed first (the root cause, below); "
                "the other ranks were stopped."
            )
        lines = ["=" * 78, head]
        rc = self.root_cause
        if rc is not None:
            lines += [f"  what  : {rc.label}" if rc.label else f"  rank  : {rc.rank}", f"  host  : {rc.host}"]
            if rc.pid > 0:  # an engine's worker (a Ray actor, a Spark task's child) is no process of this machine
                lines.append(f"  pid   : {rc.pid}")
            lines.append(f"  exit  : {rc.describe()}")
            if rc.reason:
                lines.append(f"  why   : {rc.reason}")
            if rc.tail:
                lines.append("  last stderr lines:")
                shown = rc.tail[-12:]
                user = _user_frame(rc.tail)
                if user and not any(u in shown for u in user):
                    lines += [f"    {t}" for t in user] + ["    ..."]
                lines += [f"    {t}" for t in shown]
        lines.append(f"  {'rank':>4}  {'pid':>7}  outcome")
        for r, code in enumerate(self.returncodes):
            f = next((x for x in self.failures if x.rank == r), None)
            if f is None:
                outcome = "still running" if code is None else f"exit code {code}"
            elif rc is not None and f.rank == rc.rank:
                outcome = f"{f.describe()}   <- root cause"
            elif f.stopped and f.returncode in (-signal.SIGTERM, -signal.SIGKILL, -signal.SIGINT):
                outcome = f"stopped by hora run ({f.describe()})"
            elif f.reason:
                outcome = f"{f.describe()} — {f.reason[:120]}"
            else:
                outcome = f.describe() + (f" — {f.tail[-1][:100]}" if f.tail else "")
            lines.append(f"  {r:>4}  {f.pid if f and f.pid > 0 else '':>7}  {outcome}")
        if self.stacks:
            kept = self.stacks_saved or "RunResult.stacks"
            lines.append(f"  where the ranks still running were (all threads: {kept}):")
            for r in sorted(self.stacks):
                frames = where(self.stacks[r]) or ["(only hora's and Python's own frames)"]
                lines.append(f"    rank {r}: " + "\n             ".join(frames))
        lines.append("=" * 78)
        return "\n".join(lines)


def _user_frame(tail: list[str]) -> list[str]:
    """The innermost traceback frame of the user's code (not hora's) in ``tail``, with its source line, so the
    report shows where the script was even when hora's frames fill the last lines."""
    for i in range(len(tail) - 1, -1, -1):
        line = tail[i].strip()
        if line.startswith('File "') and "/hora/" not in line and "<frozen" not in line:
            return (
                [tail[i], tail[i + 1]]
                if i + 1 < len(tail) and not tail[i + 1].strip().startswith("File")
                else [tail[i]]
            )
    return []


#: What a rank raises because of another rank: it lost a peer, a peer shut down, or it waited for a peer that
#: never submitted a collective. A rank that failed with one of these is never the root cause.
_FOLLOWER_ERRORS = ("PeerLostError", "ShutdownError", "StallError")
_STALLED_BY = re.compile(r"StallError: .*?\b(ranks? [\d, ]+?) never submitted")
ROOT_CAUSE_WINDOW = 1.0


def root_cause(failures: list[Failure]) -> Failure | None:
    """The failure that started it all.

    Exit order alone misleads: the kernel closes a dying process's sockets before its parent hears of the death,
    so a peer that reacts at once can be reaped first. Among the failures within a second of the first one (and
    not caused by hora run's own stop signals), prefer a rank killed by a signal, then one whose last error is not
    hora's reaction to another rank (PeerLostError, ShutdownError, StallError), then the earliest. When the ranks
    failed with a StallError, the root cause is the rank they waited for (named in it), even if it was still
    running (stuck, asleep) when hora run stopped it.
    """
    own = [f for f in failures if not f.stopped]
    if not own:
        return None
    first = min(f.when for f in own)

    def last_error(f: Failure) -> str:
        return next((t for t in reversed(f.tail) if t.strip()), "")

    def key(f: Failure) -> tuple[int, float]:
        follower = any(e in last_error(f) for e in _FOLLOWER_ERRORS)
        return (0 if f.returncode < 0 else 2 if follower else 1, f.when)

    chosen = min((f for f in own if f.when - first <= ROOT_CAUSE_WINDOW), key=key)
    stalled = _STALLED_BY.search(last_error(chosen))
    if stalled:
        waited_for = [int(x) for x in re.findall(r"\d+", stalled.group(1))]
        by_rank = {f.rank: f for f in failures}
        culprit = next((by_rank[r] for r in waited_for if r in by_rank), None)
        if culprit is not None:
            return dataclasses.replace(
                culprit,
                reason="the other ranks waited for it in a collective it never submitted; their StallError: "
                + last_error(chosen).split("StallError: ", 1)[1][:240],
            )
    return chosen
