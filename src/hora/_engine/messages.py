"""Requests (what a rank has ready) and Responses (what every rank executes, in the same order).

They travel on the authenticated control connections as JSON, never as pickles.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from hora._dtypes import ReduceOp

__all__ = ["Kind", "Request", "Response", "decode", "encode"]


class Kind(str, enum.Enum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"


@dataclass(frozen=True)
class Request:
    """One rank's description of a collective it has ready. Every field but ``splits`` must agree across ranks
    (allgather and alltoall may differ in the first dimension)."""

    kind: Kind
    name: str
    dtype: str = "uint8"
    shape: tuple[int, ...] = ()
    op: int = ReduceOp.SUM
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    splits: tuple[int, ...] | None = None
    process_set: int = 0

    def to_wire(self) -> list[Any]:
        return [
            self.kind.value,
            self.name,
            self.dtype,
            list(self.shape),
            int(self.op),
            self.root,
            self.prescale,
            self.postscale,
            None if self.splits is None else list(self.splits),
            self.process_set,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Request:
        return cls(
            Kind(w[0]),
            str(w[1]),
            str(w[2]),
            tuple(int(x) for x in w[3]),
            int(w[4]),
            int(w[5]),
            float(w[6]),
            float(w[7]),
            None if w[8] is None else tuple(int(x) for x in w[8]),
            int(w[9]),
        )


@dataclass
class Response:
    """What every rank executes. ``request`` is the agreed metadata (joined ranks have no request of their own);
    ``first_dims`` holds each rank's first dimension (allgather) and ``splits`` every rank's splits (alltoall)."""

    request: Request
    error: str | None = None
    error_kind: str = "mismatch"
    first_dims: list[int] | None = None
    splits: list[list[int]] | None = None
    joined: list[int] = field(default_factory=list)
    last_joined: int = -1

    def to_wire(self) -> list[Any]:
        return [
            self.request.to_wire(),
            self.error,
            self.error_kind,
            self.first_dims,
            self.splits,
            self.joined,
            self.last_joined,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Response:
        return cls(Request.from_wire(w[0]), w[1], str(w[2]), w[3], w[4], [int(x) for x in w[5]], int(w[6]))


def encode(kind: str, payload: list[Any]) -> bytes:
    return json.dumps([kind, payload], separators=(",", ":")).encode()


def decode(frame: bytes) -> tuple[str, list[Any]]:
    data = json.loads(frame)
    if not (
        isinstance(data, list) and len(data) == 2 and isinstance(data[0], str) and isinstance(data[1], list)
    ):
        raise ValueError("control message is not [kind, payload]")
    return data[0], data[1]
