"""The rounds of an elastic job: which slots form each round, what every member of the current round reported,
and what to do once all have (Horovod's ``ElasticDriver`` and ``WorkerStateRegistry``).

A *slot* is ``host:index`` (index < the host's slots); one worker process serves a slot for its whole life. Round 1
is formed at the start; when every member of the current round has reported — READY (it left the round to reset:
``ready/<slot>`` at the store), SUCCESS (exit 0) or FAILURE (any other exit) — the driver decides, as Horovod's
registry does: any success ends the job; all failed ends it; otherwise the failed workers' hosts are blacklisted
(every host of the round blacklisted ends it), the reset limit is checked, and the next round is formed from the
hosts available then (waiting up to the elastic time-out for ``min_np`` slots).

Rounds are published at the launcher's rendezvous store (:mod:`hora._runtime.elastic_join` reads them).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hora._runtime.elastic_join import HostUpdateResult
from hora._runtime.rendezvous import RendezvousServer
from hora.errors import HoraError
from hora.runner.elastic.discovery import DiscoveredHosts, HostManager
from hora.runner.hosts import HostSlots, RankSlot, assign_ranks

__all__ = [
    "FAILURE",
    "READY",
    "RESET_LIMIT_EXCEEDED_MESSAGE",
    "SUCCESS",
    "Decision",
    "ElasticDriver",
    "ElasticJobError",
    "slot_assignments",
]

READY, SUCCESS, FAILURE = "READY", "SUCCESS", "FAILURE"
#: Horovod's message, word for word (scripts and tests match it).
RESET_LIMIT_EXCEEDED_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"


class ElasticJobError(HoraError):
    """The elastic job cannot go on (reset limit, every host failed, no slots within the elastic time-out)."""


def slot_id(slot: RankSlot) -> str:
    return f"{slot.host}:{slot.local_rank}"


def slot_assignments(hosts: DiscoveredHosts, max_np: int | None) -> list[RankSlot]:
    """Ranks for the usable hosts in their order, filling each host's slots, at most ``max_np`` in all."""
    total = hosts.count_available_slots()
    n = total if max_np is None else min(total, max_np)
    return assign_ranks(n, [HostSlots(h, hosts.host_slots[h]) for h in hosts.order if hosts.host_slots.get(h)])


@dataclass(frozen=True)
class Decision:
    """What to do once every member of a round has reported."""

    action: str  # "done" (a worker succeeded), "fail" (with ``message``), "next" (form the next round)
    message: str = ""
    blacklisted: tuple[str, ...] = ()


class ElasticDriver:
    """Rounds, reports and decisions; the launcher (:mod:`hora.runner.elastic.launch`) starts and stops the
    processes. ``lock`` guards the host manager, which the discovery thread updates."""

    def __init__(
        self,
        hosts: HostManager,
        store: RendezvousServer,
        prefix: str,
        min_np: int,
        max_np: int | None,
        reset_limit: int | None,
        log: Callable[[str], None],
    ) -> None:
        self.hosts, self._store, self._prefix = hosts, store, prefix
        self.min_np, self.max_np, self.reset_limit = min_np, max_np, reset_limit
        self._log = log
        self.lock = threading.Condition()
        self.round = 0
        self.members: dict[str, RankSlot] = {}
        self.states: dict[str, str] = {}
        self.resets = 0
        self._notices = 0

    # -- host discovery (the discovery thread) ------------------------------------------------------------
    def discover(self) -> HostUpdateResult:
        """Run the discovery once; on a change that moves ranks, tell the current rank 0 (a notice).

        Raises:
            DiscoveryError: the script failed.
        """
        with self.lock:
            update = self.hosts.update_available_hosts()
            if update != HostUpdateResult.no_update:
                self._log(f"hosts changed ({update.name or int(update)}): {self.hosts.current_hosts.host_slots}")
                self._notify(update)
                self.lock.notify_all()
            return update

    def _notify(self, update: HostUpdateResult) -> None:
        if not self.members:
            return
        current = self.hosts.current_hosts
        nxt = slot_assignments(current, self.max_np) if current.count_available_slots() >= self.min_np else []
        if {slot_id(s): s for s in nxt} == self.members:
            return  # the change would not move any rank (Horovod skips it too)
        self._notices += 1
        self._store.put(
            {
                f"{self._prefix}notice/{self._notices}": json.dumps({"update": int(update)}),
                f"{self._prefix}notices": str(self._notices),
            }
        )

    def wait_for_slots(self, n: int, deadline: float, stop: Callable[[], bool]) -> DiscoveredHosts:
        """Wait until ``n`` slots are usable.

        Raises:
            ElasticJobError: not within the deadline (a ``time.monotonic()`` value), or ``stop()`` became true.
        """
        with self.lock:
            while True:
                current = self.hosts.current_hosts
                if current.count_available_slots() >= n:
                    return current
                left = deadline - time.monotonic()
                if left <= 0 or stop():
                    raise ElasticJobError(
                        f"timed out waiting for the minimum number of slots to become available: {n} needed, "
                        f"{current.count_available_slots()} usable ({dict(current.host_slots)}, blacklisted: "
                        f"{self.blacklisted() or 'none'}). Check that the discovery script lists enough hosts, "
                        "or raise --elastic-timeout."
                    )
                self.lock.wait(min(left, 0.2))

    def blacklisted(self) -> list[str]:
        return [h for h in self.hosts.current_hosts.host_slots if self.hosts.is_blacklisted(h)]

    # -- rounds ------------------------------------------------------------------------------------------------
    def form_round(self, hosts: DiscoveredHosts) -> tuple[list[RankSlot], list[str]]:
        """Assign the slots of ``hosts`` as the next round; (its members, the previous members left out of it).
        Call :meth:`publish` once the left-out workers are being stopped.

        Raises:
            ElasticJobError: no host of the previous round is left (nobody could hand the state on).
        """
        slots = slot_assignments(hosts, self.max_np)
        new = {slot_id(s): s for s in slots}
        if self.members and not {s.host for s in slots} & {s.host for s in self.members.values()}:
            raise ElasticJobError("no hosts from the previous set remain, unable to broadcast state")
        left_out = [sid for sid in self.members if sid not in new]
        self.members = new
        self.states = {}
        self.round += 1
        return slots, left_out

    def publish(self, left_out: list[str]) -> None:
        """Write the round's assignments (and a removal for each left-out worker) and its number to the store."""
        items = {
            f"{self._prefix}r{self.round}/{sid}": json.dumps(
                {
                    "rank": s.rank,
                    "size": len(self.members),
                    "local_rank": s.local_rank,
                    "local_size": s.local_size,
                    "cross_rank": s.cross_rank,
                    "cross_size": s.cross_size,
                    "notices": self._notices,
                }
            )
            for sid, s in self.members.items()
        }
        items.update({f"{self._prefix}r{self.round}/{sid}": json.dumps({"removed": True}) for sid in left_out})
        items[f"{self._prefix}round"] = str(self.round)
        self._store.put(items)  # one change: a worker that sees the round sees its assignment

    def leaving_slots(self) -> list[str]:
        """Members of the current round that got SIGTERM and said they are leaving."""
        cut = len(f"{self._prefix}leaving/")
        return [k[cut:] for k in self._store.snapshot(f"{self._prefix}leaving/") if k[cut:] in self.members]

    def drain(self, host: str) -> None:
        """A worker of ``host`` is leaving (preempted): take the host out like a failed one (blacklist, cooldown
        rules) and tell rank 0, so every rank re-forms at its next commit without a rollback."""
        with self.lock:
            if self.hosts.is_blacklisted(host):
                return
            self.hosts.blacklist(host)
            self._notify(HostUpdateResult.removed)

    def ready_slots(self) -> list[str]:
        """Members of the current round that have said they left it (READY)."""
        marks = self._store.snapshot(f"{self._prefix}ready/")
        cut = len(f"{self._prefix}ready/")
        return [k[cut:] for k, v in marks.items() if v == str(self.round) and k[cut:] in self.members]

    def call_off(self, why: str) -> None:
        """A member of the current round failed: members still assembling the round stop waiting for it (they
        reset and join the next one) instead of waiting for the start timeout."""
        self._store.put({f"{self._prefix}failed/r{self.round}": why})

    def record(self, sid: str, state: str) -> bool:
        """Record a member's report (a failure overrides READY); False when ``sid`` is not a member whose report
        counts (not in this round, or its host is blacklisted)."""
        slot = self.members.get(sid)
        if slot is None or self.hosts.is_blacklisted(slot.host):
            return False
        if sid not in self.states or state == FAILURE:
            self.states[sid] = state
        return True

    def unreported(self) -> list[str]:
        """Members whose report is still missing (their hosts not taken out)."""
        with self.lock:
            return [
                sid
                for sid, s in self.members.items()
                if sid not in self.states and not self.hosts.is_blacklisted(s.host)
            ]

    def decide(self) -> Decision | None:
        """None until every member has reported (members of a host taken out while the round ran are on their way
        out and are not waited for); then what Horovod's registry decides."""
        if self.unreported() or not self.states:
            return None
        states = list(self.states.values())
        if SUCCESS in states:
            return Decision("done")
        if states.count(FAILURE) == len(states):
            return Decision("fail", f"every worker of the last round ({len(states)}) failed")
        failed_hosts = sorted({self.members[sid].host for sid, st in self.states.items() if st == FAILURE})
        with self.lock:
            for host in failed_hosts:
                self.hosts.blacklist(host)
            if all(self.hosts.is_blacklisted(s.host) for s in self.members.values()):
                return Decision("fail", "every host of the last round is blacklisted", tuple(failed_hosts))
        if self.reset_limit is not None and self.resets >= self.reset_limit:
            return Decision("fail", RESET_LIMIT_EXCEEDED_MESSAGE.format(self.reset_limit), tuple(failed_hosts))
        self.resets += 1
        return Decision("next", blacklisted=tuple(failed_hosts))
