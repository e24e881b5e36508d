"""The response cache: negotiated responses every rank remembers under the same slot number.

A collective that was negotiated once (through the coordinator) is remembered by every rank in the same slot,
because every rank inserts the same responses in the same order and evicts by the same rule. The next time a
rank submits the same request it only sets bit ``slot`` in its cycle's bit vector; a bitwise AND across ranks
(see ``engine.py``) then says which cached collectives are ready everywhere, with no message through rank 0.

Each rank keeps its *own* request beside the shared response: for allgather and alltoall the requests differ by
rank (first dimension, splits), and a hit must mean "my request is exactly what it was when the response was
made". A rank whose request changed (a new shape) misses and marks the slot invalid, which evicts it everywhere.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from hora._engine.messages import Kind, Request, Response

__all__ = ["ResponseCache", "cacheable"]


def cacheable(resp: Response) -> bool:
    """Whether a response may be remembered: a successful collective that will recur under its name. Unnamed
    collectives (``allreduce.noname.17``) never recur, so caching them would only evict useful entries."""
    req = resp.request
    return (
        resp.error is None
        and not resp.joined
        and req.kind is not Kind.JOIN
        and ".noname." not in req.name
    )


@dataclass
class _Cached:
    response: Response
    mine: Request


class ResponseCache:
    """``capacity`` slots, least recently used evicted first. Deterministic: the same calls in the same order
    give the same slots on every rank."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: dict[int, _Cached] = {}
        self._by_name: dict[str, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._free = list(range(capacity))  # a heap: the lowest free slot is taken first

    def __len__(self) -> int:
        return len(self._slots)

    def lookup(self, req: Request) -> tuple[int, bool]:
        """``(slot, hit)``: ``(-1, False)`` when the name is unknown; ``(slot, False)`` when the name is cached
        with another request (the slot must be invalidated); ``(slot, True)`` on a hit."""
        slot = self._by_name.get(req.name, -1)
        if slot < 0:
            return -1, False
        return slot, self._slots[slot].mine == req

    def entry(self, name: str) -> object | None:
        """What the cache holds under ``name`` (an object that changes whenever the slot is evicted, reused or
        renegotiated), or None: a holder of facts derived from a lookup checks with it that they still stand."""
        return self._slots.get(self._by_name.get(name, -1))

    def mine(self, slot: int) -> Request:
        """This rank's request behind ``slot``."""
        return self._slots[slot].mine

    def response(self, slot: int) -> Response:
        return self._slots[slot].response

    def touch(self, slot: int) -> None:
        self._lru.move_to_end(slot)

    def put(self, resp: Response, mine: Request) -> int | None:
        """Remember ``resp`` (this rank submitted ``mine``). Returns the slot that was evicted to make room, if
        any, so the caller can re-route a request that was waiting on it."""
        name = resp.request.name
        slot = self._by_name.get(name)
        if slot is not None:  # renegotiated (e.g. after a join): refresh in place
            self._slots[slot] = _Cached(resp, mine)
            self.touch(slot)
            return None
        evicted = None
        if len(self._slots) >= self.capacity:
            evicted = next(iter(self._lru))
            self.evict(evicted)
        slot = heapq.heappop(self._free)
        self._slots[slot] = _Cached(resp, mine)
        self._by_name[name] = slot
        self._lru[slot] = None
        return evicted

    def clear(self) -> None:
        """Forget every slot (autotune switched the cache off or on, on every rank at the same cycle)."""
        for slot in list(self._slots):
            self.evict(slot)

    def evict(self, slot: int) -> None:
        cached = self._slots.pop(slot, None)
        if cached is not None:
            del self._by_name[cached.response.request.name]
            del self._lru[slot]
            heapq.heappush(self._free, slot)
