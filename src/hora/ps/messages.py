"""What a worker asks of a parameter server and what it answers, as types: one record per kind of request and reply.

The hot requests (push, pull, push_pull, push_rows, pull_rows) are :class:`HotRequest`: the worker fills one per
shard and :class:`~hora.ps.server_link.ServerLink` packs it into the binary header of :mod:`hora.ps.protocol`; the
server unpacks that header field by field and never builds a record for it (the hot path allocates nothing per
request). The control requests (register, layout, poison, shm, stats, save, load) are frozen dataclasses that travel
as the JSON headers of :mod:`hora.ps.protocol` (:meth:`ControlRequest.header`); the server turns each header it
receives into its record with :func:`parse_control`, which checks every field once (a wrong one raises
``ValueError``/``KeyError`` naming it, and the worker gets that as the server's refusal) and refuses unknown
operations (:class:`ProtocolError`: the connection is dropped). Each control request names the kind of
:class:`Reply` it gets (``{"ok": true, ...}``, parsed by the worker); a refusal is the server's JSON error instead
(:class:`hora.ps.server_link.Refusal`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from hora.errors import ProtocolError
from hora.ps.rules import UpdateRule, parse_rule

__all__ = [
    "CONSISTENCY_MODES",
    "DTYPES",
    "OPS",
    "AttachSegment",
    "ControlRequest",
    "HotRequest",
    "Layout",
    "LayoutReply",
    "Load",
    "Op",
    "Piece",
    "Poison",
    "Register",
    "Reply",
    "Save",
    "SaveReply",
    "SavedShard",
    "SegmentReply",
    "ShardSource",
    "Stats",
    "StatsReply",
    "VariableLayout",
    "parse_control",
]

#: dtypes a variable may have (the update rules compute in the variable's own type).
DTYPES = ("<f4", "<f8")
CONSISTENCY_MODES = ("async", "bounded", "sync")


class Op(enum.Enum):
    """The hot operations: ``code`` on the wire, and whether it is ``dense`` (on a whole shard, and may go
    single-copy: :mod:`hora.ps.cma`). Plain attributes: the hot path reads them per request."""

    PUSH = (1, True)
    PULL = (2, True)
    PUSH_PULL = (3, True)
    PUSH_ROWS = (4, False)
    PULL_ROWS = (5, False)

    code: int
    dense: bool

    def __init__(self, code: int, dense: bool) -> None:
        self.code, self.dense = code, dense

    def __str__(self) -> str:
        return self.name.lower()


#: The hot operations in the order of their codes: ``OPS[code - 1]``.
OPS = tuple(sorted(Op, key=lambda op: op.code))


@dataclass(slots=True)
class HotRequest:
    """One hot request on one shard: ``payload`` holds what goes to the server (the gradient; the row ids and then
    the rows' gradients), ``into`` where the values that come back go, ``rows`` the number of rows of a rows
    request. Not frozen: a frozen dataclass costs four times as much to build, and one is built per shard per
    push/pull; nothing changes it after it is built."""

    op: Op
    name: str
    shard: int
    payload: tuple[np.ndarray, ...] = ()
    into: np.ndarray | None = None
    rows: int = 0


@dataclass(frozen=True)
class Reply:
    """A server's answer that it did a control request: ``{"ok": true}`` and, in subclasses, what it found."""

    def header(self) -> dict[str, Any]:
        return {"ok": True}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Reply:
        return cls()


@dataclass(frozen=True)
class LayoutReply(Reply):
    """Server 0's answer to :class:`Layout`: ``mismatch`` (and the first layout's ``servers``) when this worker's
    layout differs from the first one."""

    mismatch: str | None = None
    name: str = ""
    servers: tuple[int, ...] = ()

    def header(self) -> dict[str, Any]:
        if self.mismatch is None:
            return {"ok": True}
        return {"ok": True, "mismatch": self.mismatch, "name": self.name, "servers": list(self.servers)}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> LayoutReply:
        if "mismatch" not in header:
            return cls()
        servers = tuple(int(s) for s in header["servers"])
        return cls(str(header["mismatch"]), str(header["name"]), servers)


@dataclass(frozen=True)
class SegmentReply(Reply):
    """The answer to :class:`AttachSegment`: whether single copy is granted (:mod:`hora.ps.cma`)."""

    single_copy: bool = False

    def header(self) -> dict[str, Any]:
        return {"ok": True, "single_copy": self.single_copy}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> SegmentReply:
        return cls(bool(header.get("single_copy")))


@dataclass(frozen=True)
class StatsReply(Reply):
    """The server's counters (:meth:`hora.ps.server.ParameterServer.stats`, a JSON object as users get it)."""

    stats: dict[str, Any] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        return {"ok": True, "stats": self.stats}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> StatsReply:
        stats = header["stats"]
        if not isinstance(stats, dict):
            raise ValueError(f"stats must be an object, got {stats!r}")
        return cls(stats)


class SavedShard(NamedTuple):
    """Shard ``shard`` of ``name``, written by ``server`` into ``file`` of the checkpoint directory."""

    name: str
    shard: int
    file: str
    server: int


@dataclass(frozen=True)
class SaveReply(Reply):
    """The answer to :class:`Save`: the files the server wrote."""

    files: tuple[SavedShard, ...] = ()

    def header(self) -> dict[str, Any]:
        return {"ok": True, "files": [f._asdict() for f in self.files]}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> SaveReply:
        return cls(
            tuple(
                SavedShard(str(f["name"]), int(f["shard"]), str(f["file"]), int(f["server"]))
                for f in header["files"]
            )
        )


class ControlRequest:
    """A control request: its ``op`` on the wire, its JSON header and the payload that follows the header, and the
    kind of reply it gets."""

    op: ClassVar[str]
    reply: ClassVar[type[Reply]] = Reply

    def fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def header(self) -> dict[str, Any]:
        """The JSON header (:func:`hora.ps.protocol.send_message` adds ``nbytes``)."""
        return {"op": self.op, **self.fields()}

    def payload(self) -> Sequence[np.ndarray]:
        return ()

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> ControlRequest:
        raise NotImplementedError


def _mode(mode: Any, staleness: Any, what: str) -> tuple[str, int]:
    mode, staleness = str(mode), int(staleness)
    if mode not in CONSISTENCY_MODES or staleness < 0:
        raise ValueError(f"{what}: consistency {mode!r}/{staleness} is not async, bounded(k>=0) or sync")
    return mode, staleness


@dataclass(frozen=True)
class Register(ControlRequest):
    """Create shard ``shard`` of variable ``name`` with ``value`` (worker 0's values win) and its settings."""

    op: ClassVar[str] = "register"
    name: str
    shard: int
    shape: tuple[int, ...]
    dtype: str
    rule: UpdateRule
    consistency: str
    staleness: int
    value: np.ndarray | None = field(default=None, compare=False)  # the worker's; a server reads the payload

    def fields(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shard": self.shard,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "rule": self.rule.to_json(),
            "consistency": self.consistency,
            "staleness": self.staleness,
        }

    def payload(self) -> Sequence[np.ndarray]:
        return () if self.value is None else (self.value,)

    @property
    def nbytes(self) -> int:
        """The payload's length, from the shape and dtype (checked before anything is allocated)."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Register:
        name, index = str(header["name"]), int(header["shard"])
        dtype = str(header["dtype"])
        if dtype not in DTYPES:
            raise ValueError(
                f"register '{name}': dtype {dtype!r} is not supported; use float32 ('<f4') or float64 ('<f8')"
            )
        shape = tuple(int(d) for d in header["shape"])
        if not shape or min(shape) < 0:
            raise ValueError(f"register '{name}': shape {shape} must have at least one axis")
        rule = parse_rule(header["rule"], f"register '{name}'")
        mode, staleness = _mode(header["consistency"], header["staleness"], f"register '{name}'")
        return cls(name, index, shape, dtype, rule, mode, staleness)


@dataclass(frozen=True)
class VariableLayout:
    """How a worker registered a variable: server 0 keeps the first worker's and compares the others' with it."""

    shape: tuple[int, ...]
    dtype: str
    offsets: tuple[int, ...]
    servers: tuple[int, ...]
    rule: UpdateRule
    consistency: str
    staleness: int

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "offsets": list(self.offsets),
            "servers": list(self.servers),
            "rule": self.rule.to_json(),
            "consistency": self.consistency,
            "staleness": self.staleness,
        }

    @classmethod
    def from_json(cls, layout: Mapping[str, Any], what: str) -> VariableLayout:
        if not isinstance(layout, Mapping):
            raise ValueError(f"{what}: the layout must be an object, got {layout!r}")
        mode, staleness = _mode(layout["consistency"], layout["staleness"], what)
        return cls(
            tuple(int(d) for d in layout["shape"]),
            str(layout["dtype"]),
            tuple(int(o) for o in layout["offsets"]),
            tuple(int(s) for s in layout["servers"]),
            parse_rule(layout["rule"], what),
            mode,
            staleness,
        )

    def differences(self, other: VariableLayout, first: str) -> list[str]:
        """``other``'s settings that differ from this layout (``first``: whose this one is)."""
        mine, theirs = self.to_json(), other.to_json()
        return [f"{k} {theirs[k]!r} ({first}: {mine[k]!r})" for k in mine if mine[k] != theirs[k]]


@dataclass(frozen=True)
class Layout(ControlRequest):
    """To server 0: this worker's layout of variable ``name``."""

    op: ClassVar[str] = "layout"
    reply: ClassVar[type[Reply]] = LayoutReply
    name: str
    layout: VariableLayout

    def fields(self) -> dict[str, Any]:
        return {"name": self.name, "layout": self.layout.to_json()}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Layout:
        name = str(header["name"])
        return cls(name, VariableLayout.from_json(header["layout"], f"register '{name}'"))


@dataclass(frozen=True)
class Poison(ControlRequest):
    """A registration mismatch found elsewhere: every later request on variable ``name`` raises ``message``."""

    op: ClassVar[str] = "poison"
    name: str
    message: str

    def fields(self) -> dict[str, Any]:
        return {"name": self.name, "message": self.message}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Poison:
        return cls(str(header["name"]), str(header["message"]))


@dataclass(frozen=True)
class AttachSegment(ControlRequest):
    """Map the worker's new shared segment (:mod:`hora.ps.segment`); with ``pid`` and ``token_at``, also check
    whether this server may read and write that process's memory (single copy, :mod:`hora.ps.cma`)."""

    op: ClassVar[str] = "shm"
    reply: ClassVar[type[Reply]] = SegmentReply
    name: str
    size: int
    pid: int | None = None
    token_at: int | None = None

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "size": self.size}
        if self.pid is not None:
            out.update(pid=self.pid, token_at=self.token_at)
        return out

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> AttachSegment:
        name, size = str(header["name"]), int(header["size"])
        if "pid" in header:
            return cls(name, size, int(header["pid"]), int(header["token_at"]))
        return cls(name, size)


@dataclass(frozen=True)
class Stats(ControlRequest):
    """The server's counters; with ``progress``, also every variable's clocks and the pulls waiting now."""

    op: ClassVar[str] = "stats"
    reply: ClassVar[type[Reply]] = StatsReply
    progress: bool = False

    def fields(self) -> dict[str, Any]:
        return {"progress": self.progress}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Stats:
        return cls(bool(header.get("progress")))


@dataclass(frozen=True)
class Save(ControlRequest):
    """Write every shard of the server into ``dir`` (:mod:`hora.ps.checkpoint`)."""

    op: ClassVar[str] = "save"
    reply: ClassVar[type[Reply]] = SaveReply
    dir: str

    def fields(self) -> dict[str, Any]:
        return {"dir": self.dir}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Save:
        return cls(str(header["dir"]))


class Piece(NamedTuple):
    """Rows ``lo..hi`` of an old shard ``file``, which go to row ``dst`` of the new shard."""

    file: str
    lo: int
    hi: int
    dst: int


@dataclass(frozen=True)
class ShardSource:
    """The pieces of old shard files that make up shard ``shard`` of ``name``."""

    name: str
    shard: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Load(ControlRequest):
    """Fill shards from the checkpoint in ``dir`` (re-sharded: :func:`hora.ps.checkpoint.reshard_sources`)."""

    op: ClassVar[str] = "load"
    dir: str
    sources: tuple[ShardSource, ...]

    def fields(self) -> dict[str, Any]:
        sources = [
            {"name": s.name, "shard": s.shard, "pieces": [list(p) for p in s.pieces]} for s in self.sources
        ]
        return {"dir": self.dir, "sources": sources}

    @classmethod
    def parse(cls, header: Mapping[str, Any]) -> Load:
        sources = tuple(
            ShardSource(
                str(s["name"]),
                int(s["shard"]),
                tuple(Piece(str(f), int(lo), int(hi), int(dst)) for f, lo, hi, dst in s["pieces"]),
            )
            for s in header["sources"]
        )
        return cls(str(header["dir"]), sources)


_KINDS: dict[str, type[ControlRequest]] = {
    kind.op: kind for kind in (Register, Layout, Poison, AttachSegment, Stats, Save, Load)
}


def parse_control(header: Mapping[str, Any], what: str) -> ControlRequest:
    """The request a JSON header stands for, every field checked (``what``: the sender, for errors)."""
    op = header.get("op")
    kind = _KINDS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise ProtocolError(f"{what} asked for unknown operation {header.get('op')!r}")
    return kind.parse(header)
