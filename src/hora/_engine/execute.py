"""Running negotiated responses on the transport: shapes, counts, scaling, fused groups, zero contributions of
joined ranks, and completing the handles."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from math import prod
from typing import Any

import numpy as np

from hora._dtypes import DTYPES, ReduceOp, even_counts, scale_into
from hora._engine.adasum import adasum_fused
from hora._engine.fusion import plan
from hora._engine.handle import Entry
from hora._engine.messages import Kind, Request, Response
from hora._engine.outputs import new_array
from hora._engine.timeline import tensor_args, tensor_names
from hora._transport.base import Transport
from hora.errors import (
    CollectiveError,
    HoraError,
    HoraInternalError,
    MismatchError,
    ShutdownError,
    StallError,
)

__all__ = ["execute", "execute_fused", "phase", "run_responses", "transport_activity"]

_buffers: dict[np.dtype, np.ndarray] = {}  # one reusable fusion buffer per dtype (engine thread only)


def _fusion_buffer(dtype: np.dtype, n: int) -> np.ndarray:
    buf = _buffers.get(dtype)
    if buf is None or buf.size < n:
        buf = _buffers[dtype] = np.empty(n, dtype)
    return buf[:n]


@contextlib.contextmanager
def phase(timeline: Any, names: list[str], activity: str) -> Iterator[None]:
    if timeline is None:
        yield
    else:
        with timeline.activities(names, activity):
            yield


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)


def _scaled_reduce(
    plane: Transport, req: Request, src: np.ndarray, dst: np.ndarray, counts: list[int] | None
) -> None:
    op, pre, post = req.op, req.prescale, req.postscale
    if op == ReduceOp.AVERAGE:
        op, post = ReduceOp.SUM, post / plane.size
    if pre != 1.0:
        scaled = dst if counts is None else np.empty_like(src)  # allreduce scales straight into its output
        scale_into(src, pre, scaled)
        src = scaled
    if op == ReduceOp.ADASUM:  # the frontend allows it for allreduce only
        adasum_fused(plane, [src], [dst])
    elif counts is None:
        plane.allreduce_scaled(src, dst, op, post)
        return
    else:
        plane.reducescatter(src, dst, counts, op)
    if post != 1.0:
        scale_into(dst, post, dst)


def execute(plane: Transport, resp: Response, entry: Entry | None) -> Any:
    """Run ``resp`` with this rank's ``entry`` (``None`` on a joined rank, which contributes zeros); return the
    handle's result."""
    req = resp.request
    kind = req.kind
    plane.what = f"{kind.value} '{req.name}'"
    if kind is Kind.BARRIER:
        return None
    if kind is Kind.JOIN:
        return resp.last_joined
    dtype = DTYPES[req.dtype]
    if entry is None:  # joined rank: only allreduce reaches here (the coordinator refuses the rest)
        zeros = np.zeros(prod(req.shape), dtype)
        _scaled_reduce(plane, req, zeros, zeros, None)
        return None
    assert entry.input is not None  # a grouped request (entry.pieces) runs through execute_fused (_run_one)
    src = entry.input
    size, me = plane.size, plane.rank
    row = prod(req.shape[1:]) if req.shape else 1  # elements per first-dimension row
    if kind is Kind.ALLREDUCE:
        out = entry.output if entry.output is not None else new_array(src.shape, src.dtype)
        _scaled_reduce(plane, req, _flat(src), _flat(out), None)
        return out
    if kind is Kind.REDUCESCATTER:
        rows = even_counts(req.shape[0] if req.shape else 1, size)  # lower ranks take the remainder
        out = new_array((rows[me], *req.shape[1:]), dtype)
        _scaled_reduce(plane, req, _flat(src), _flat(out), [r * row for r in rows])
        return out
    if kind is Kind.BROADCAST:
        out = (
            entry.output
            if entry.output is not None
            else (_copy(src) if me == req.root else new_array(src.shape, src.dtype))
        )
        plane.broadcast(_flat(out).view(np.uint8), req.root)
        return out
    nbytes = row * dtype.itemsize
    if kind is Kind.ALLGATHER:
        assert resp.first_dims is not None
        out = new_array((sum(resp.first_dims), *req.shape[1:]), dtype)
        plane.allgather(
            _flat(src).view(np.uint8), _flat(out).view(np.uint8), [d * nbytes for d in resp.first_dims]
        )
        return out
    if kind is Kind.ALLTOALL:
        assert resp.splits is not None
        matrix = resp.splits
        received = [matrix[r][me] for r in range(size)]
        out = new_array((sum(received), *req.shape[1:]), dtype)
        plane.alltoall(
            _flat(src).view(np.uint8),
            [s * nbytes for s in matrix[me]],
            _flat(out).view(np.uint8),
            [s * nbytes for s in received],
            max((max(r) for r in matrix if r), default=0) * nbytes,
        )
        return out, np.asarray(received, dtype=np.int32)
    raise AssertionError(f"unknown collective {kind}")


def execute_fused(
    plane: Transport, responses: list[Response], entries: list[Entry], timeline: Any, activity: str
) -> list[Any]:
    """Run allreduces that agree on dtype, op and scale factors as one reduction; return each output (the list
    of outputs for a grouped request).

    The data plane reduces the virtual concatenation of the inputs: the shared-memory plane stages the pieces
    straight into its segment (its slot *is* the fusion buffer), other planes pack into one buffer first."""
    req = responses[0].request
    op, pre, post = req.op, req.prescale, req.postscale
    if op == ReduceOp.AVERAGE:
        op, post = ReduceOp.SUM, post / plane.size
    outs: list[Any] = []
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    for e in entries:
        if e.pieces is not None:  # a grouped request: its tensors join the concatenation one by one
            outs.append(list(e.pieces.outs))
            srcs.extend(e.pieces.srcs)
            dsts.extend(e.pieces.dsts)
            continue
        assert e.input is not None  # fused groups hold allreduces submitted by this rank, never a joined rank's
        out = e.output if e.output is not None else _like(e.input)
        outs.append(out)
        srcs.append(_flat(e.input))
        dsts.append(_flat(out))
    names = [n for r in responses for n in tensor_names(r.request)]
    plane.what = f"fused allreduce of {len(names)} tensors ('{names[0]}', ...)"
    if pre != 1.0:
        for s, d in zip(srcs, dsts):
            scale_into(s, pre, d)
        srcs = dsts
    if op == ReduceOp.ADASUM:  # each tensor (each piece of a grouped request) gets its own coefficients
        with phase(timeline, names, activity):
            adasum_fused(plane, srcs, dsts)
        if post != 1.0:
            for d in dsts:
                scale_into(d, post, d)
    elif getattr(plane, "stages_pieces", False):  # shm: packing into the segment is the transport's first copy
        with phase(timeline, names, activity):
            plane.allreduce_fused_scaled(srcs, dsts, op, post)
    else:
        total = sum(s.size for s in srcs)
        buf = _fusion_buffer(srcs[0].dtype, total)
        with phase(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
            np.concatenate(srcs, out=buf)
        with phase(timeline, names, activity):
            plane.allreduce_scaled(buf, buf, op, post)
        with phase(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            lo = 0
            for d in dsts:
                d[...] = buf[lo : lo + d.size]
                lo += d.size
    return outs


_ERRORS: dict[str, type[CollectiveError]] = {
    "mismatch": MismatchError,
    "duplicate": MismatchError,
    "shutdown": ShutdownError,
    "join": CollectiveError,
    "stall": StallError,
}


def transport_activity(transport: Transport, kind: Kind) -> str:
    """The timeline's name for a collective on ``transport``: ``SHM_ALLREDUCE``, ``TCP_BROADCAST``..."""
    return f"{type(transport).__name__.removesuffix('Transport').upper()}_{kind.value.upper()}"


def run_responses(
    transport: Transport,
    rank: int,
    ready: list[tuple[Response, Entry | None]],
    fusion_threshold: int,
    timeline: Any,
    started: Callable[[list[str]], None],
) -> None:
    """Execute a cycle's responses (each with this rank's entry, None on a joined rank) group by group, as
    :func:`~hora._engine.fusion.plan` groups them, completing the handles. ``started(names)`` is told before each
    group runs. A transport failure fails the group's handles and is raised (it ends the engine)."""
    responses = [r for r, _ in ready]
    for group in plan(responses, fusion_threshold):
        items = [ready[i] for i in group]
        names = [r.request.name for r, _ in items]
        started(names)
        if timeline is not None:
            for r, _ in items:
                for n, args in zip(tensor_names(r.request), tensor_args(r.request)):
                    timeline.start(n, r.request.kind.value, args)
        try:
            if len(items) == 1:
                _run_one(transport, rank, *items[0], timeline)
            else:
                _run_group(transport, rank, items, timeline)
        finally:
            if timeline is not None:
                for r, _ in items:
                    for n in tensor_names(r.request):
                        timeline.end(n)


def _run_one(transport: Transport, rank: int, resp: Response, entry: Entry | None, timeline: Any) -> None:
    if resp.error is not None:
        if entry is not None:
            entry.handle._set_error(_ERRORS.get(resp.error_kind, CollectiveError)(resp.error))
        return
    name = resp.request.name
    if entry is None and rank not in resp.joined and resp.request.kind is not Kind.JOIN:
        raise HoraInternalError(f"rank {rank} got a response for '{name}', which it never submitted")
    try:
        activity = transport_activity(transport, resp.request.kind)
        if entry is not None and entry.pieces is not None:  # a grouped request: timed per tensor, as fused ones
            result = execute_fused(transport, [resp], [entry], timeline, activity)[0]
        else:
            with phase(timeline, [name], activity):
                result = execute(transport, resp, entry)
    except HoraError as exc:
        if entry is not None:
            entry.handle._set_error(exc)
        raise
    if entry is not None:
        entry.handle._set_result(result)


def _run_group(transport: Transport, rank: int, items: list[tuple[Response, Entry | None]], timeline: Any) -> None:
    entries: list[Entry] = []
    for resp, entry in items:
        if entry is None:  # fused responses have no joined ranks, so every rank has every entry
            raise HoraInternalError(f"rank {rank} has no entry for fused '{resp.request.name}'")
        entries.append(entry)
    try:
        results = execute_fused(
            transport, [r for r, _ in items], entries, timeline, transport_activity(transport, Kind.ALLREDUCE)
        )
    except HoraError as exc:
        for e in entries:
            e.handle._set_error(exc)
        raise
    for e, result in zip(entries, results):
        e.handle._set_result(result)


def _like(src: np.ndarray | None) -> np.ndarray:
    assert src is not None
    return new_array(src.shape, src.dtype)


def _copy(src: np.ndarray) -> np.ndarray:
    out = new_array(src.shape, src.dtype)
    np.copyto(out, src)
    return out
