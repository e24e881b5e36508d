"""What the members of a group being assembled know of each other: each one's :class:`Peer` record, the
:class:`Topology` they give, and the :class:`Directory` they exchange them through before they are connected."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from hora._runtime.rendezvous import MissingKeys, RendezvousClient
from hora.errors import ConfigError, PeerLostError, RendezvousError

__all__ = ["Directory", "Peer", "StoreDirectory", "Topology"]


@dataclass(frozen=True)
class Peer:
    """What a member publishes about itself when a group is assembled."""

    host: str
    pid: int
    start: int  # process start time (clock ticks since boot): tells a live peer from a recycled pid
    addr: str
    port: int
    kernel: str  # the kernel's boot id: members with the same one share this machine's cores
    local_hint: tuple[int | None, int | None] = (None, None)  # the launcher's local rank and size, if it said
    fusion_threshold: int = 0
    cache_capacity: int = 0

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Peer:
        hint = data.get("local_hint") or (None, None)
        return cls(
            str(data["host"]),
            int(data["pid"]),
            int(data["start"]),
            str(data["addr"]),
            int(data["port"]),
            str(data.get("kernel", "")),
            (hint[0], hint[1]),
            int(data["fusion_threshold"]),
            int(data["cache_capacity"]),
        )


@dataclass(frozen=True)
class Topology:
    """Where the members of a group run: hosts in order of first appearance, and each member's place."""

    hosts: tuple[str, ...]
    local: tuple[tuple[int, ...], ...]  # the members of each host, in host order
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    @classmethod
    def of(cls, peers: list[Peer], me: int, source: str) -> Topology:
        """The topology ``peers`` give for member ``me``; launcher hints that disagree are a ConfigError."""
        hosts = list(dict.fromkeys(p.host for p in peers))
        local = {h: [r for r, p in enumerate(peers) if p.host == h] for h in hosts}
        problems = []
        for r, p in enumerate(peers):
            lr, ls = local[p.host].index(r), len(local[p.host])
            hint_rank, hint_size = p.local_hint
            if (hint_rank is not None and hint_rank != lr) or (hint_size is not None and hint_size != ls):
                problems.append(
                    f"rank {r} on {p.host}: launcher says local rank {hint_rank} of {hint_size}, "
                    f"hosts at the rendezvous give {lr} of {ls}"
                )
        if problems:
            raise ConfigError(
                f"the {source} launcher's local ranks disagree with the hosts the ranks reported:\n  "
                + "\n  ".join(problems)
                + "\nEvery rank on one machine must report the same host name: check HORA_HOSTNAME / the launcher's "
                "host list."
            )
        host = peers[me].host
        local_rank, local_size = local[host].index(me), len(local[host])
        cross = [h for h in hosts if len(local[h]) > local_rank]
        return cls(
            tuple(hosts), tuple(tuple(local[h]) for h in hosts), local_rank, local_size, cross.index(host), len(cross)
        )

    @classmethod
    def single(cls, host: str) -> Topology:
        return cls((host,), ((0,),), 0, 1, 0, 1)


class Directory(Protocol):
    """How the participants of an assembly exchange what they need before they are connected. Every participant
    makes the same calls in the same order; non-members pass ``None``."""

    def allgather(self, key: str, value: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Every member's value, in member order."""
        ...

    def barrier(self, key: str) -> None: ...


#: How often a wait at the store looks whether the assembly was called off (``abort``).
ABORT_CHECK_SECONDS = 0.5


class StoreDirectory:
    """A :class:`Directory` on the rendezvous store, for a group whose participants are exactly its members.

    ``abort`` (an elastic round's watch) is asked every :data:`ABORT_CHECK_SECONDS` while a wait lasts: when it
    gives a reason (a member died during start-up), the wait ends with :class:`PeerLostError` at once instead of at
    the start timeout."""

    def __init__(
        self,
        store: RendezvousClient,
        rank: int,
        size: int,
        deadline: float,
        missing: Callable[[list[int]], str],
        abort: Callable[[], str | None] | None = None,
    ):
        self._store, self._rank, self._size, self._deadline = store, rank, size, deadline
        self._missing = missing  # the message when ranks never publish
        self._abort = abort

    def allgather(self, key: str, value: dict[str, Any] | None) -> list[dict[str, Any]]:
        self._store.set(f"{key}/{self._rank}", json.dumps(value))
        try:
            raw = self._wait([f"{key}/{r}" for r in range(self._size)])
        except MissingKeys as exc:
            raise RendezvousError(self._missing([int(k.rsplit("/", 1)[1]) for k in exc.missing])) from None
        return [json.loads(raw[f"{key}/{r}"]) for r in range(self._size)]

    def barrier(self, key: str) -> None:
        self._store.add(key, 1)
        try:
            self._wait([key], at_least=self._size)
        except MissingKeys:
            raise RendezvousError(
                f"rank {self._rank}: not every rank finished start-up ('{key}') before the start timeout; "
                "another rank probably failed — see its error"
            ) from None

    def _wait(self, keys: list[str], at_least: int | None = None) -> dict[str, str]:
        while True:
            left = max(0.0, self._deadline - time.monotonic())
            if self._abort is None:
                return self._store.wait(keys, left, at_least)
            try:
                return self._store.wait(keys, min(left, ABORT_CHECK_SECONDS), at_least)
            except MissingKeys:
                if left <= ABORT_CHECK_SECONDS:
                    raise
            reason = self._abort()
            if reason is not None:
                raise PeerLostError(f"rank {self._rank}: start-up called off: {reason}")
