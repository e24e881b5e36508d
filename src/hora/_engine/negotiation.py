"""The coordinator's message table: which ranks have which tensors ready, and what every rank executes next.

Pure logic (no sockets, no threads), so it is tested in-process. Rank 0's engine feeds it every rank's requests
and sends the responses it produces to all ranks, which execute them in that order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from hora._dtypes import ReduceOp
from hora._engine.messages import Kind, Request, Response

__all__ = ["Coordinator", "format_ranks"]


def format_ranks(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def _shape(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in s) + ("," if len(s) == 1 else "") + ")"


def _op_name(op: int) -> str:
    try:
        return ReduceOp(op).name.capitalize()
    except ValueError:
        return str(op)


# Per kind: (label, value getter, formatter) of the fields that must agree across ranks.
_Field = tuple[str, Callable[[Request], Any], Callable[[Any], str]]
_COMMON: list[_Field] = [("dtype", lambda r: r.dtype, str)]
_SHAPE: _Field = ("shape", lambda r: r.shape, _shape)
_TRAILING: _Field = ("trailing dimensions (all but the first)", lambda r: r.shape[1:], _shape)
_NDIM: _Field = ("number of dimensions", lambda r: max(len(r.shape), 1), str)
_REDUCE: list[_Field] = [
    # A grouped allreduce travels as one request of the concatenated size; ``splits`` holds its tensors' sizes.
    (
        "grouped tensor sizes (elements per tensor)",
        lambda r: r.splits,
        lambda v: "none (not a grouped call)" if v is None else "[" + ", ".join(map(str, v)) + "]",
    ),
    _SHAPE,
    ("op", lambda r: r.op, _op_name),
    ("prescale_factor", lambda r: r.prescale, repr),
    ("postscale_factor", lambda r: r.postscale, repr),
]
_FIELDS: dict[Kind, list[_Field]] = {
    Kind.ALLREDUCE: _COMMON + _REDUCE,
    Kind.REDUCESCATTER: _COMMON + _REDUCE,
    Kind.BROADCAST: [*_COMMON, _SHAPE, ("root_rank", lambda r: r.root, str)],
    Kind.ALLGATHER: [*_COMMON, _NDIM, _TRAILING],
    Kind.ALLTOALL: [*_COMMON, _NDIM, _TRAILING],
    Kind.BARRIER: [],
}


class Coordinator:
    """Matches requests by name across ``size`` ranks and emits responses in a deterministic order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._table: dict[str, dict[int, Request]] = {}
        self._since: dict[str, float] = {}
        self._joined: list[int] = []
        self._out: list[Response] = []

    # -- inputs -----------------------------------------------------------------------------------------------
    def submit(self, rank: int, requests: Iterable[Request], waited: Iterable[float] | None = None) -> None:
        """Requests of ``rank``; ``waited``: how long each has waited on that rank already (the stall inspector
        counts from the earliest submission of a name)."""
        now = time.monotonic()
        requests = list(requests)
        ages = list(waited) if waited is not None else [0.0] * len(requests)
        for req, age in zip(requests, ages):
            if req.kind is Kind.JOIN:
                self._join(rank)
                continue
            entry = self._table.setdefault(req.name, {})
            since = now - max(0.0, age)
            if not entry or since < self._since.get(req.name, since):
                self._since[req.name] = since
            if rank in entry:
                self._error(
                    req,
                    f"{req.kind.value} '{req.name}' was submitted twice by rank {rank} before it "
                    "completed; names must be unique among pending collectives.",
                    "duplicate",
                )
                continue
            entry[rank] = req
            self._check(req.name)

    @property
    def joined(self) -> list[int]:
        """Ranks that called join() and wait for the others to join too."""
        return list(self._joined)

    def waiting(self, name: str) -> bool:
        """Whether some rank has already submitted ``name`` (and it still waits for others)."""
        return name in self._table

    def pending(self) -> dict[str, tuple[float, list[int]]]:
        """name -> (seconds waiting, ranks that submitted it): what a stall inspector reports."""
        now = time.monotonic()
        return {n: (now - self._since[n], sorted(e)) for n, e in self._table.items()}

    # -- output -----------------------------------------------------------------------------------------------
    def take(self) -> list[Response]:
        out, self._out = self._out, []
        return out

    # -- internals --------------------------------------------------------------------------------------------
    def _join(self, rank: int) -> None:
        if rank not in self._joined:
            self._joined.append(rank)
        for name in list(self._table):
            self._check(name)
        if len(self._joined) == self.size:
            last = self._joined[-1]
            self._joined = []
            self._out.append(Response(Request(Kind.JOIN, "join"), last_joined=last))

    def _error(self, req: Request, message: str, kind: str = "mismatch") -> None:
        self._out.append(Response(req, error=message, error_kind=kind))

    def _check(self, name: str) -> None:
        entry = self._table[name]
        joined_only = [r for r in self._joined if r not in entry]
        if len(entry) + len(joined_only) < self.size:
            return
        del self._table[name]
        self._since.pop(name, None)
        self._out.append(self._respond(name, entry, joined_only))

    def _respond(self, name: str, entry: dict[int, Request], joined: list[int]) -> Response:
        ranks = sorted(entry)
        first = entry[ranks[0]]
        kinds = {r: entry[r].kind for r in ranks}
        if len(set(kinds.values())) > 1:
            return Response(
                first, error=self._mismatch("collective", name, "operation", kinds, lambda k: k.value)
            )
        kind = first.kind
        for label, get, fmt in _FIELDS[kind]:
            values = {r: get(entry[r]) for r in ranks}
            if len(set(values.values())) > 1:
                return Response(first, error=self._mismatch(kind.value, name, label, values, fmt))
        if kind is Kind.BROADCAST and not 0 <= first.root < self.size:
            return Response(
                first,
                error=f"broadcast '{name}' has root_rank {first.root}, but there are only "
                f"{self.size} ranks (0..{self.size - 1}).",
            )
        if joined and kind is not Kind.ALLREDUCE:
            return Response(
                first,
                error=f"{kind.value} '{name}' cannot run: {format_ranks(joined)} already "
                "called join(); while ranks are joined only allreduce can run.",
                error_kind="join",
            )
        response = Response(first, joined=sorted(joined))
        if kind is Kind.ALLGATHER:
            response.first_dims = [entry[r].shape[0] if entry[r].shape else 1 for r in range(self.size)]
        elif kind is Kind.ALLTOALL:
            response.splits = [list(entry[r].splits or ()) for r in range(self.size)]
            bad = [r for r in range(self.size) if len(response.splits[r]) != self.size]
            if bad:
                return Response(
                    first,
                    error=f"alltoall '{name}' needs {self.size} splits per rank, one per "
                    f"destination; {format_ranks(bad)} gave another number.",
                )
        return response

    @staticmethod
    def _mismatch(kind: str, name: str, label: str, values: dict[int, Any], fmt: Callable[[Any], str]) -> str:
        groups: dict[Any, list[int]] = {}
        for r, v in values.items():
            groups.setdefault(v, []).append(r)
        parts = [f"{fmt(v)} on {format_ranks(rs)}" for v, rs in groups.items()]
        return (
            f"{kind} '{name}' has {label} {parts[0]} but "
            + " and ".join(parts[1:])
            + f"; all ranks must submit the same {label.split(' (')[0]}."
        )
