"""The cycle's exchange vector and the direct path of tiny cached allreduces.

Every cycle starts with one small collective over the transport, the **exchange**: an ``int8`` vector reduced with
``MIN`` across ranks, so that a field written as ``1`` becomes an AND and a field written as ``-1`` becomes an OR
(:class:`ExchangeLayout` names the fields). On shared memory each rank's vector is its *row* in the segment, and
what follows the vector in the row carries the **direct path** (:class:`DirectPath`): the data of up to
:data:`DIRECT_MAX_TENSORS` ready cached allreduces of at most :data:`DIRECT_MAX_BYTES` each, so such a collective
costs the exchange's one barrier instead of three.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hora._dtypes import DTYPES, HALF, ReduceOp, combine, reduce_into, scale_into
from hora._engine.cache import ResponseCache
from hora._engine.fusion import nbytes
from hora._engine.handle import Entry
from hora._engine.messages import Kind, Response
from hora._engine.outputs import new_array
from hora._engine.timeline import Timeline, request_args

__all__ = [
    "DIRECT_MAX_BYTES",
    "DIRECT_MAX_TENSORS",
    "DIRECT_PAYLOAD_BYTES",
    "DirectPath",
    "ExchangeLayout",
    "exchange_length",
    "exchange_row_bytes",
]

#: Cached allreduces up to this size travel inside the exchange (shared memory only), up to DIRECT_PAYLOAD_BYTES
#: per rank and cycle: one barrier per small collective instead of the exchange's plus two more.
DIRECT_MAX_BYTES = 64 << 10
DIRECT_PAYLOAD_BYTES = 256 << 10
#: ... and only in cycles with at most this many ready cached collectives: the direct path costs a few µs of
#: Python per tensor, more than a fused reduction's per-tensor cost once there are many.
DIRECT_MAX_TENSORS = 4


def exchange_length(cache_capacity: int, size: int) -> int:
    """Bytes of the exchange vector: ready and invalid bits per cache slot, the flags, a BYE flag per rank."""
    return 2 * cache_capacity + 6 + size


def exchange_row_bytes(cache_capacity: int, size: int) -> int:
    """Bytes of a rank's exchange row in shared memory: the vector, then room for direct-path payloads."""
    vector = -(-exchange_length(cache_capacity, size) // 64) * 64
    return vector + (DIRECT_PAYLOAD_BYTES if cache_capacity else 0)


class ExchangeLayout:
    """Where each field sits in the exchange vector (C = HORA_CACHE_CAPACITY)::

        [0, C)        cached requests ready on this rank (AND: ready everywhere; 2 = data in the row, direct path)
        [C, 2C)       cache slots this rank invalidates (OR)
        FULL          this rank needs a full negotiation round (OR)
        JOINED        this rank has called join() (OR)
        BUSY          this rank has collectives in flight (OR; idle engines slow down when nobody is busy)
        ANY_INVALID   some rank invalidates a slot (OR)
        MARKS         how many slots this rank put in its row (MIN over ranks)
        MARKS_NEG     minus that count (MIN over ranks: minus the maximum)
        BYE + r       rank r is shutting down (OR)
    """

    def __init__(self, cache_capacity: int, size: int) -> None:
        c = cache_capacity
        self.capacity = c
        self.length = exchange_length(c, size)
        self.FULL, self.JOINED, self.BUSY, self.ANY_INVALID = 2 * c, 2 * c + 1, 2 * c + 2, 2 * c + 3
        self.MARKS, self.MARKS_NEG, self.BYE = 2 * c + 4, 2 * c + 5, 2 * c + 6
        #: where direct-path data starts in a shared-memory exchange row
        self.payload_at = -(-self.length // 64) * 64


class DirectPath:
    """Puts tiny cached allreduces into this rank's exchange row and reduces them from every rank's row."""

    def __init__(self, cache: ResponseCache, layout: ExchangeLayout, size: int) -> None:
        self._cache = cache
        self._layout = layout
        self._size = size
        self._info: dict[int, tuple[Response, Any]] = {}  # id(cached response) -> its direct-path facts

    def pack(self, row: np.ndarray, ready: dict[int, Entry]) -> dict[int, int]:
        """Put the data of the ``ready`` cached allreduces that qualify after the vector in ``row``, in slot order,
        and mark them 2 instead of 1: where every rank marked 2, the exchange has carried every rank's data and
        each rank reduces it from the rows, with no further barrier. Returns slot -> offset in the row."""
        pos, limit = self._layout.payload_at, row.size
        marked: dict[int, int] = {}
        for slot in sorted(ready):
            info = self.info(slot)
            if info is None:
                continue
            n = info[1]
            if pos + n > limit:
                break
            src = ready[slot].input
            assert src is not None
            row[pos : pos + n] = src.reshape(-1).view(np.int8)
            row[slot] = 2
            marked[slot] = pos
            pos += -(-n // 8) * 8
        return marked

    def info(self, slot: int) -> tuple[np.dtype, int, int, float] | None:
        """(dtype, bytes, op, postscale) of a cached allreduce small enough for the direct path, else None."""
        resp = self._cache.response(slot)
        info = self._info.get(id(resp))
        if info is None or info[0] is not resp:
            req = resp.request
            ok = (
                req.kind is Kind.ALLREDUCE
                and req.op != ReduceOp.ADASUM  # pairwise swaps, not a reduction of the rows
                and req.splits is None  # a grouped request's tensors are pieces, not one input
                and req.prescale == 1.0
                and nbytes(resp) <= DIRECT_MAX_BYTES
                and not (DTYPES[req.dtype] in HALF and self._size > 2)  # would need float32 accumulation
            )
            op, post = req.op, req.postscale
            if op == ReduceOp.AVERAGE:
                op, post = ReduceOp.SUM, post / self._size
            info = (resp, (DTYPES[req.dtype], nbytes(resp), op, post) if ok else None)
            if len(self._info) > 4 * max(self._layout.capacity, 1):
                self._info.clear()
            self._info[id(resp)] = info
        return info[1]

    def run(
        self,
        direct: list[tuple[int, Entry]],
        rows: np.ndarray,
        marked: dict[int, int],
        agreed_marks: tuple[int, int],
        timeline: Timeline | None,
        activity: str,
    ) -> None:
        """Reduce each of ``direct`` (slot, entry) from every rank's row and complete its handle. ``marked`` is
        this rank's slot -> offset; ``agreed_marks`` the (min, max) over ranks of how many slots they marked."""
        size = self._size
        low, high = agreed_marks
        if low == high == len(marked) < 127:
            offsets = [marked] * size  # every rank marked the same slots, so placed them where this rank did
        else:
            offsets = []
            for r in range(size):  # where rank r put each slot: its own marked slots, in slot order
                at, pos = {}, self._layout.payload_at
                for slot in np.flatnonzero(rows[r, : self._layout.capacity] == 2).tolist():
                    at[slot] = pos
                    pos += -(-nbytes(self._cache.response(slot)) // 8) * 8
                offsets.append(at)
        for slot, entry in direct:
            info = self.info(slot)
            assert info is not None and entry.input is not None
            dtype, n, op, post = info
            out = entry.output if entry.output is not None else new_array(entry.input.shape, entry.input.dtype)
            flat = out.reshape(-1)
            parts = [rows[r, offsets[r][slot] : offsets[r][slot] + n].view(dtype) for r in range(size)]
            if timeline is not None:
                timeline.start(entry.request.name, "allreduce", request_args(entry.request))
                timeline.activity_start(entry.request.name, activity)
            if size == 1:
                flat[...] = parts[0]
            else:
                combine(parts[0], parts[1], flat, op)  # rank order on every rank: bitwise identical results
                for p in parts[2:]:
                    reduce_into(flat, p, op)
            if post != 1.0:
                scale_into(flat, post, flat)
            if timeline is not None:
                timeline.end(entry.request.name)
            entry.handle._set_result(out)

