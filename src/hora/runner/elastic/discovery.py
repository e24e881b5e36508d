"""Which hosts an elastic job may use: the host discovery (a script, or the fixed ``-H`` hosts), each host's
blacklist state with its cooldown, and the order hosts are given ranks in — Horovod's
``horovod/runner/elastic/discovery.py``, with the same rules:

- the script prints one host per line, ``host`` or ``host:slots`` (``--slots-per-host`` for the bare ones); a
  non-zero exit is an error (the driver fails the job on the first run, retries later ones);
- a host whose worker failed is blacklisted: for good without ``--blacklist-cooldown-range``, else for
  ``min(max, max(min, min * 2**n + U(0, min)))`` seconds after its n-th failure, after which it may return;
- hosts keep their relative order from one assignment to the next (survivors keep their relative ranks) and new
  hosts come after them.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hora._runtime.elastic_join import HostUpdateResult
from hora.errors import ConfigError, HoraError

__all__ = [
    "COOLDOWN_LIMITS",
    "DiscoveredHosts",
    "DiscoveryError",
    "FixedHosts",
    "HostDiscovery",
    "HostDiscoveryScript",
    "HostManager",
    "HostState",
    "parse_discovery_output",
]

#: The bounds a ``--blacklist-cooldown-range`` must stay within (Horovod's: 1 s .. 1 h).
COOLDOWN_LIMITS = (1, 3600)


class DiscoveryError(HoraError):
    """The host discovery script failed (non-zero exit, time-out, or output that is not ``host[:slots]`` lines)."""


def parse_discovery_output(text: str, default_slots: int) -> dict[str, int]:
    """``host`` / ``host:slots`` lines -> host -> slots (blank lines ignored; the last line of a host wins)."""
    hosts: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue  # a script prints nothing while no host is ready
        host, sep, slots = line.rpartition(":")
        if not sep:
            host = line
        if not host or (sep and not slots.isdigit()):
            raise DiscoveryError(f"the host discovery script printed {raw!r}: expected 'host' or 'host:slots'")
        hosts[host] = int(slots) if sep else default_slots
    return hosts


class HostDiscovery(Protocol):
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """host -> slots of every usable host."""
        ...


class HostDiscoveryScript:
    """Runs ``--host-discovery-script`` (through the shell, as Horovod does) and parses what it prints."""

    def __init__(self, script: str, default_slots: int, timeout: float = 30.0) -> None:
        self.script, self.default_slots, self.timeout = script, default_slots, timeout

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        try:
            done = subprocess.run(
                self.script, shell=True, capture_output=True, timeout=self.timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise DiscoveryError(
                f"the host discovery script {self.script!r} did not finish within {self.timeout:g}s"
            ) from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise DiscoveryError(
                f"the host discovery script {self.script!r} failed with exit code {done.returncode}"
                + (f": {err[0]}" if err[0] else "")
            )
        return parse_discovery_output(done.stdout.decode(errors="replace"), self.default_slots)


class FixedHosts:
    """The hosts of ``-H`` / ``--hostfile`` in an elastic job without a discovery script (fault tolerance only)."""

    def __init__(self, host_slots: dict[str, int]) -> None:
        self.host_slots = dict(host_slots)

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return dict(self.host_slots)


class HostState:
    """One host's blacklist state (Horovod's ``HostState``)."""

    def __init__(self, cooldown_range: tuple[int, int] | None = None, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._blacklisted = False
        self._count = 0
        self._low, self._high = cooldown_range if cooldown_range else (-1, -1)
        self._cooldown_end = 0.0

    def blacklist(self) -> None:
        """Blacklist the host and, with a cooldown range, start its cooldown (not again while one runs)."""
        self._blacklisted = True
        now = self._clock()
        if self._cooldown_end > now or self._low < 0:
            return
        self._count += 1
        delay = self._low * (1 << self._count) + random.uniform(0, 1) * self._low
        self._cooldown_end = now + max(self._low, min(self._high, delay))

    def whitelist(self) -> None:
        self._cooldown_end = 0.0
        self._blacklisted = False

    def is_blacklisted(self) -> bool:
        return self._blacklisted

    def is_resurrected(self) -> bool:
        """Its cooldown has ended (it may be used again)."""
        return self._cooldown_end > 0 and self._cooldown_end <= self._clock()

    @property
    def cooldown_end(self) -> float:
        return self._cooldown_end


def check_cooldown_range(cooldown_range: tuple[int, int] | None) -> None:
    if cooldown_range is None:
        return
    low, high = cooldown_range
    if low < COOLDOWN_LIMITS[0] or high > COOLDOWN_LIMITS[1] or low > high:
        raise ConfigError(
            f"--blacklist-cooldown-range {low} {high}: need {COOLDOWN_LIMITS[0]} <= MIN <= MAX <= "
            f"{COOLDOWN_LIMITS[1]} seconds"
        )


@dataclass(frozen=True)
class DiscoveredHosts:
    """The hosts last discovered (with their slots) and the usable ones in assignment order."""

    host_slots: dict[str, int]
    order: tuple[str, ...]  # not blacklisted, in the order ranks are given

    def count_available_slots(self) -> int:
        return sum(self.host_slots.get(h, 0) for h in self.order)


class HostManager:
    """The hosts an elastic job may use now (Horovod's ``HostManager``)."""

    def __init__(
        self,
        discovery: HostDiscovery,
        cooldown_range: tuple[int, int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_cooldown_range(cooldown_range)
        self._discovery = discovery
        self._cooldown_range = cooldown_range
        self._clock = clock
        self._states: dict[str, HostState] = {}
        self._slots: dict[str, int] = {}
        self._order: list[str] = []

    def state(self, host: str) -> HostState:
        if host not in self._states:
            self._states[host] = HostState(self._cooldown_range, self._clock)
        return self._states[host]

    def update_available_hosts(self) -> HostUpdateResult:
        """Run the discovery once; what changed since the last run (added and/or removed hosts or slots).

        Raises:
            DiscoveryError: the script failed.
        """
        found = self._discovery.find_available_hosts_and_slots()
        resurrected = [h for h in found if self.state(h).is_resurrected()]
        if found == self._slots and not resurrected:
            return HostUpdateResult.no_update
        update = HostUpdateResult.no_update
        for host, slots in self._slots.items():
            if host not in found or found[host] < slots:
                update |= HostUpdateResult.removed
        for host, slots in found.items():
            if host not in self._slots or slots > self._slots[host] or host in resurrected:
                update |= HostUpdateResult.added
        usable = {h for h in found if not self.state(h).is_blacklisted() or h in resurrected}
        self._order = [h for h in self._order if h in usable] + sorted(usable - set(self._order))
        self._slots = found
        for host in resurrected:
            self.state(host).whitelist()
        return update

    @property
    def current_hosts(self) -> DiscoveredHosts:
        self._order = [h for h in self._order if not self.state(h).is_blacklisted()]
        return DiscoveredHosts(dict(self._slots), tuple(self._order))

    def blacklist(self, host: str) -> None:
        self.state(host).blacklist()

    def is_blacklisted(self, host: str) -> bool:
        return self.state(host).is_blacklisted()
