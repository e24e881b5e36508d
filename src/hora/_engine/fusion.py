"""Tensor fusion: which of a cycle's responses run together as one reduction.

Every rank runs :func:`plan` on the same ordered list of responses, so every rank makes the same groups and calls
the data plane in the same order. Allreduces of one dtype, op and scale factors are packed up to ``threshold``
bytes; the planner looks past responses that cannot join the current group (another dtype, a broadcast, one too
big) for later ones that can, as Horovod does.
"""

from __future__ import annotations

from math import prod

from hora._dtypes import DTYPES
from hora._engine.messages import Kind, Response

__all__ = ["nbytes", "plan"]


def nbytes(resp: Response) -> int:
    req = resp.request
    return prod(req.shape) * DTYPES[req.dtype].itemsize


def _key(resp: Response) -> tuple | None:
    """What must agree for two responses to share a buffer; ``None`` when the response cannot be fused."""
    req = resp.request
    if req.kind is not Kind.ALLREDUCE or resp.error is not None or resp.joined:
        return None
    return (req.dtype, req.op, req.prescale, req.postscale)


def plan(responses: list[Response], threshold: int) -> list[list[int]]:
    """Group the indices of ``responses``; each group runs as one collective, groups in the returned order."""
    n = len(responses)
    taken = [False] * n
    groups: list[list[int]] = []
    for i in range(n):
        if taken[i]:
            continue
        taken[i] = True
        key = _key(responses[i])
        total = nbytes(responses[i]) if key is not None else 0
        group = [i]
        if key is not None and threshold > 0 and total < threshold:
            for j in range(i + 1, n):
                if taken[j] or _key(responses[j]) != key:
                    continue
                size = nbytes(responses[j])
                if total + size <= threshold:
                    group.append(j)
                    taken[j] = True
                    total += size
                    if total >= threshold:
                        break
        groups.append(group)
    return groups
