"""How a ``DistributedOptimizer`` / ``DistributedTrainer`` / ``DistributedGradientTape`` reduces gradients, described
once: :func:`describe_gradients` checks Horovod's arguments (``op``, ``gradient_predivide_factor``, ``groups`` /
``num_groups``, ``compression``, ``sparse_as_dense``, ``backward_passes_per_step``, ``process_set``) and hora's
``strategy`` (resolved by :func:`hora._strategy.resolve_strategy`, so every adapter answers ``hora run --strategy``
the same way) and returns a frozen :class:`GradientReduction` that every adapter consumes.

The arithmetic is Horovod's: ``op=Average`` with ``gradient_predivide_factor=f`` reduces with prescale ``1/f`` and
postscale ``f`` (the engine divides an Average by the set's size after the sum, so the result is the average);
adapters that must sum instead (MXNet folds the division into the optimizer's gradient scale, as Horovod's does)
take :meth:`GradientReduction.summed`.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hora._dtypes import ReduceOp
from hora._frontend.core import resolve_op
from hora._frontend.process_set import ProcessSet, global_process_set
from hora._strategy import resolve_strategy
from hora.errors import UnsupportedError

__all__ = [
    "FIRST_BUCKET",
    "GradientReduction",
    "beside_backward",
    "bucket_cap",
    "buckets",
    "describe_gradients",
    "first_bucket",
    "parameter_differences",
    "split_list",
]

T = TypeVar("T")


def split_list(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` in ``parts`` consecutive runs of nearly equal length, longer ones first (Horovod's ``split_list``)."""
    d, r = divmod(len(items), parts)
    return [list(items[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)]) for i in range(parts)]


@dataclass(frozen=True, eq=False)
class GradientReduction:
    """One adapter's gradient reduction, checked. ``op`` is what the collectives run with ``prescale`` and
    ``postscale``; ``groups`` is None (hora's default: every gradient of a step in one grouped collective), an int
    (that many groups of consecutive gradients) or explicit groups of variables (a variable in no group is reduced
    on its own, as in Horovod)."""

    op: ReduceOp
    prescale: float
    postscale: float
    predivide: float
    groups: int | tuple[tuple[Any, ...], ...] | None
    compression: Any
    sparse_as_dense: bool
    process_set: ProcessSet
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    strategy: str

    @property
    def averaging(self) -> bool:
        return self.op is ReduceOp.AVERAGE

    def set_size(self) -> int:
        """The number of ranks the gradients are reduced over."""
        size = self.process_set.size()
        if size is None:
            raise ValueError(
                f"{self.process_set!r} has not been added: call hvd.add_process_set(...) on every rank first"
            )
        return size

    def summed(self) -> tuple[float, float]:
        """(prescale, postscale) for an adapter that sums (op=Sum) and scales afterwards itself: the postscale then
        includes the division by the set's size that an Average does."""
        if self.op is ReduceOp.AVERAGE:
            return self.prescale, self.postscale / self.set_size()
        return self.prescale, self.postscale

    def partition(self, present: Sequence[T], variables: Sequence[Any] | None = None) -> list[list[T]]:
        """``present`` (gradients, or their indices) in the groups they are reduced in, in a fixed order.
        ``variables[i]`` is the variable of ``present[i]``; explicit groups match variables by identity."""
        items = list(present)
        if not items:
            return []
        if self.groups is None:
            return [items]
        if isinstance(self.groups, int):
            return [g for g in split_list(items, min(self.groups, len(items))) if g]
        if variables is None or len(variables) != len(items):
            raise ValueError("groups given as lists of variables need the variable of every gradient")
        where = {id(v): i for i, v in enumerate(variables)}
        parts, used = [], set()
        for group in self.groups:
            idx = [where[id(v)] for v in group if id(v) in where]
            used.update(idx)
            if idx:
                parts.append([items[i] for i in idx])
        return parts + [[items[i]] for i in range(len(items)) if i not in used]


def _groups(groups: Any, num_groups: int, what: str) -> int | tuple[tuple[Any, ...], ...] | None:
    if num_groups:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=4,
        )
        if groups is None:
            groups = num_groups
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool) and groups == 0):
        return None
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        return groups
    if isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups):
        seen: set[int] = set()
        for g in groups:
            for v in g:
                if id(v) in seen:
                    raise ValueError(
                        f"{what}: a variable appears in more than one of the groups; list it once"
                    )
                seen.add(id(v))
        return tuple(tuple(g) for g in groups)
    raise ValueError(
        f"{what}: groups should be a non-negative integer or a list of lists of variables (parameters); got {groups!r}"
    )


def describe_gradients(
    what: str,
    *,
    op: int | None = ReduceOp.AVERAGE,
    gradient_predivide_factor: float = 1.0,
    groups: Any = None,
    num_groups: int = 0,
    compression: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    strategy: str | None = None,
    strategies: tuple[str, ...] = ("allreduce",),
    instead: str = "",
    staleness: int | None = None,
    consistency: str | None = None,
    ps_parameters: Any = None,
    adasum: bool = False,
) -> GradientReduction:
    """The checked description of ``what``'s reduction (``what``, e.g. ``hora.jax.DistributedOptimizer``, names it in
    errors). ``strategies``: the strategies this adapter implements; another one, given or from ``HORA_STRATEGY``
    (``hora run --strategy``), is an :class:`~hora.errors.UnsupportedError` ending with ``instead``. ``adasum``:
    whether the adapter implements ``op=Adasum`` (Horovod's rules are checked here: no ``average_aggregated_gradients``,
    the global process set, the allreduce strategy)."""
    resolved_strategy = resolve_strategy(
        strategy,
        strategies,
        staleness=staleness,
        consistency=consistency,
        ps_parameters=ps_parameters,
        what=what,
        instead=instead,
    )
    resolved = resolve_op(None, op)
    if resolved is ReduceOp.ADASUM:
        _check_adasum(what, adasum, process_set, resolved_strategy, average_aggregated_gradients)
    factor = float(gradient_predivide_factor)
    if factor != 1.0 and resolved is not ReduceOp.AVERAGE:
        raise ValueError(
            f"{what}: gradient_predivide_factor={gradient_predivide_factor} needs op=Average (it splits the averaging "
            f"around the sum); got op={resolved.name.title()}. Leave gradient_predivide_factor at 1.0 or use op=Average"
        )
    if not factor > 0:
        raise ValueError(f"{what}: gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
    if (
        isinstance(backward_passes_per_step, bool)
        or not isinstance(backward_passes_per_step, int)
        or backward_passes_per_step < 1
    ):
        raise ValueError(
            f"{what}: backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}"
        )
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set must be a hvd.ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(
            f"{what}: {process_set!r} has not been added: call hvd.add_process_set(...) on every rank first"
        )
    averaging = resolved is ReduceOp.AVERAGE
    return GradientReduction(
        op=resolved,
        prescale=1.0 / factor if averaging else 1.0,
        postscale=factor if averaging else 1.0,
        predivide=factor,
        groups=_groups(groups, num_groups, what),
        compression=compression,
        sparse_as_dense=bool(sparse_as_dense),
        process_set=process_set,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=bool(average_aggregated_gradients),
        strategy=resolved_strategy,
    )


def _check_adasum(what: str, implemented: bool, process_set: Any, strategy: str, average_aggregated: bool) -> None:
    if not implemented:
        raise UnsupportedError(f"{what}: op=Adasum is not supported by this optimizer yet; use Average or Sum")
    if average_aggregated:  # Horovod's ValueError (horovod.tensorflow.DistributedOptimizer), whatever the passes
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if strategy != "allreduce":
        raise UnsupportedError(f"{what}: op=Adasum needs strategy='allreduce', not {strategy!r}")
    if isinstance(process_set, ProcessSet) and process_set.process_set_id not in (None, 0):
        raise UnsupportedError("Adasum does not support non-global process sets yet.")


#: The first bucket's size (PyTorch DDP's ``_DEFAULT_FIRST_BUCKET_BYTES``): small, so that the first grouped
#: allreduce starts while most of the backward pass is still to run.
FIRST_BUCKET = 1 << 20


def beside_backward(accelerator: bool, compute_threads: int, ranks_here: int, cpus: int) -> bool:
    """Whether an allreduce can run beside the backward pass: gradients on an accelerator, or a core left for each
    of the host's ``ranks_here`` ranks' engine thread beside its ``compute_threads``, out of ``cpus``. Without a
    free core an early allreduce only takes turns with the backward pass on the same cores: one more engine cycle
    and more waits for the peers, nothing overlapped (measured in docs/performance.md, "The first bucket on CPU")."""
    return accelerator or ranks_here * (compute_threads + 1) <= cpus


def first_bucket(cap: int, beside: bool) -> int:
    """The first bucket's size: :data:`FIRST_BUCKET` where its allreduce can run beside the rest of the backward
    pass (``beside``: :func:`beside_backward`), so communication starts early, else ``cap``."""
    return min(FIRST_BUCKET, cap) if beside else cap


def buckets(
    sizes: Sequence[int], cap: int, first: int = FIRST_BUCKET, kinds: Sequence[Hashable] | None = None
) -> list[list[int]]:
    """Indices ``0..len(sizes)-1`` in buckets of at most ``first`` bytes (the first bucket of each kind) and ``cap``
    bytes (the others); a tensor larger than its bucket's cap is a bucket of its own. ``kinds`` (e.g. each tensor's
    dtype) keeps tensors of different kinds apart, one open bucket per kind as DDP's: a bucket is one flat buffer.
    The caller passes the gradients in the order they become ready (reverse registration order for a backward
    pass); buckets come out in the order they fill, the partly filled ones last, in the order they were opened."""
    out: list[list[int]] = []
    open_: dict[Hashable, list[int]] = {}
    filled: dict[Hashable, int] = {}
    closed: dict[Hashable, int] = {}
    for i, n in enumerate(sizes):
        kind = None if kinds is None else kinds[i]
        limit = min(first, cap) if not closed.get(kind) else cap
        current = open_.get(kind)
        if current and filled[kind] + n > limit:
            out.append(current)
            closed[kind] = closed.get(kind, 0) + 1
            current = None
        if not current:
            current = open_[kind] = []
            filled[kind] = 0
        current.append(i)
        filled[kind] += n
    out.extend(b for b in open_.values() if b)
    return out


def bucket_cap() -> int:
    """The ``bucket_cap`` setting of this job (``HORA_BUCKET_CAP``, ``hora run --bucket-cap-mb``)."""
    from hora._runtime import context
    from hora.config import Config

    return context.current().config.bucket_cap if context.is_initialized() else Config.resolve().bucket_cap


def parameter_differences(everyone: Sequence[Sequence[tuple[str, tuple[int, ...], str]]]) -> str:
    """How each rank's (name, shape, dtype) list differs from rank 0's, at most five names each way ("" when every
    rank has the same): an optimizer whose ranks differ would wait for ever on the gradients only some submit."""
    lines = []
    reference = everyone[0]
    for r, other in enumerate(everyone[1:], start=1):
        if other == reference:
            continue
        missing = sorted(set(reference) - set(other))
        extra = sorted(set(other) - set(reference))
        if missing:
            lines.append(f"rank {r} lacks {', '.join(f'{n} {list(s)} {d}' for n, s, d in missing[:5])}")
        if extra:
            lines.append(f"rank {r} has extra {', '.join(f'{n} {list(s)} {d}' for n, s, d in extra[:5])}")
    return "; ".join(lines)
