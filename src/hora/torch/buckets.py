"""Gradient buckets of ``hora.torch.DistributedOptimizer``, as DDP's: the small gradients of one bucket travel as
one flat tensor, so a step of hundreds of small gradients costs a handful of collectives, not hundreds.

When the last gradient of a bucket is ready, its small gradients are copied into the bucket's own buffer (one
``torch._foreach_copy_`` into views of it) and the buffer and the bucket's large gradients (:data:`DIRECT` bytes
or more: copying them would cost more than the engine's per-tensor work) go as one grouped allreduce, in place;
``synchronize`` copies the results back into each ``p.grad`` that is not its own result (one
``torch._foreach_copy_``). ``p.grad`` never aliases the buffer, which the next step reuses, unless the user asks
for DDP's ``gradient_as_bucket_view``: then each small ``p.grad`` *is* its view of the buffer (autograd accumulates
into it, the allreduce reduces it in place, ``zero_grad`` zeroes it there), and neither copy is made. Every
gradient of a bucket has one dtype and device (``buckets(..., kinds=...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hora._frontend.gradients import GradientReduction, beside_backward, buckets, first_bucket
from hora._frontend.surface import local_size
from hora._proc import usable_cpus
from hora.torch.mpi_ops import grouped_allreduce_async_

#: Gradients of this many bytes or more go as themselves (in place), not through the bucket's flat buffer.
DIRECT = 128 << 10


class Bucket:
    """One bucket: its parameters (in the order their gradients become ready), which of them go flat, the reusable
    flat buffer and its views shaped as those parameters (made once: per-step Python work per gradient is what
    buckets save)."""

    def __init__(self, params: list[torch.Tensor], name: str) -> None:
        self.name = name
        self.as_views = False  # gradient_as_bucket_view: each small p.grad is its view of the buffer
        self._set(params)

    def _set(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self._small = [i for i, p in enumerate(params) if p.numel() * p.element_size() < DIRECT]
        self._large = [i for i, p in enumerate(params) if p.numel() * p.element_size() >= DIRECT]
        self._small_params = [params[i] for i in self._small]
        self._large_params = [params[i] for i in self._large]
        self._flat: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []

    def leave(self, p: torch.Tensor) -> None:
        self._set([q for q in self.params if q is not p])

    def submit(
        self, grads: list[torch.Tensor], reduction: GradientReduction, sparse: list[bool] | None = None
    ) -> tuple[Any, Any]:
        """Start the bucket's allreduce of ``grads`` (dense, one per parameter, in ``params`` order; ``sparse``:
        which of them stand for a sparse ``p.grad``, None for none): (handle, the compression's contexts)."""
        tensors = [grads[i] for i in self._large]
        if self._small:
            small = [grads[i] for i in self._small]
            flat = self._flat
            if flat is None:  # one dtype and device per bucket: the layout alone decides
                total = sum(g.numel() for g in small)
                flat = self._flat = torch.zeros(total, dtype=small[0].dtype, device=small[0].device)
                self._views = _views_of(flat, self._small_params)
            if self.as_views:
                self._hold(small, sparse)
            else:
                with torch.no_grad():
                    torch._foreach_copy_(self._views, small)
            tensors.insert(0, flat)
        compressed, ctxs = zip(*(reduction.compression.compress(t) for t in tensors))
        handle = grouped_allreduce_async_(
            list(compressed),
            name=self.name,
            op=reduction.op,
            prescale_factor=reduction.prescale,
            postscale_factor=reduction.postscale,
            process_set=reduction.process_set,
        )
        return handle, ctxs

    def _hold(self, small: list[torch.Tensor], sparse: list[bool] | None) -> None:
        """gradient_as_bucket_view: a small gradient that is not already its view of the buffer (the first step,
        or ``p.grad`` set to None or replaced since) is copied into it, and ``p.grad`` becomes that view (not for
        a sparse ``p.grad``, which stays sparse); autograd then accumulates into the buffer itself."""
        views = self._views
        stale = [k for k, (g, v) in enumerate(zip(small, views)) if g.data_ptr() != v.data_ptr()]
        if not stale:
            return
        with torch.no_grad():
            torch._foreach_copy_([views[k] for k in stale], [small[k] for k in stale])
        for k in stale:
            i = self._small[k]
            if sparse is None or not sparse[i]:
                self.params[i].grad = views[k]

    def held(self) -> dict[torch.Tensor, torch.Tensor]:
        """The parameters whose ``p.grad`` is their view of the buffer, and that view."""
        if not self.as_views or self._flat is None:
            return {}
        return {p: v for p, v in zip(self._small_params, self._views) if p.grad is v}

    def results(self, outputs: list[torch.Tensor], ctxs: Any, reduction: GradientReduction) -> list[torch.Tensor]:
        """The reduced gradients in ``params`` order: views of the bucket's buffer (copy them out before the bucket's
        next ``submit``) and the large gradients' results (the gradient itself when reduced in place)."""
        done = [reduction.compression.decompress(out, ctx) for out, ctx in zip(outputs, ctxs)]
        result: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        if self._small:
            flat = done.pop(0)
            same = self._flat is not None and flat.data_ptr() == self._flat.data_ptr()
            views = self._views if same else _views_of(flat, self._small_params)
            for i, v in zip(self._small, views):
                result[i] = v
        for i, out in zip(self._large, done):
            result[i] = out
        return result

    def write_back(
        self,
        outputs: list[torch.Tensor],
        ctxs: Any,
        reduction: GradientReduction,
        sparse: list[bool] | None,
        write_sparse: Callable[[torch.Tensor, torch.Tensor, bool], None],
    ) -> None:
        """Put the reduced gradients into each ``p.grad``: copied, unless reduced in place; ``write_sparse`` for a
        gradient that was sparse (``sparse_as_dense``). ``sparse`` None: every gradient was dense, and each
        ``p.grad`` is the tensor that was submitted."""
        if sparse is None:  # the step's usual case, with no per-gradient Python beyond reading p.grad
            done = [reduction.compression.decompress(out, ctx) for out, ctx in zip(outputs, ctxs)]
            with torch.no_grad():
                if self._small:
                    flat = done.pop(0)
                    same = self._flat is not None and flat.data_ptr() == self._flat.data_ptr()
                    if self.as_views:  # every p.grad is its view: reduced in place, unless compressed
                        if not same:
                            self._flat.copy_(flat)  # type: ignore[union-attr]  # made by submit
                    else:
                        views = self._views if same else _views_of(flat, self._small_params)
                        torch._foreach_copy_([p.grad for p in self._small_params], views)  # type: ignore[misc]
                for p, out in zip(self._large_params, done):
                    grad: Any = p.grad
                    if out.data_ptr() != grad.data_ptr():  # compressed: not reduced in place
                        grad.copy_(out)
            return
        grads: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for p, out, was_sparse in zip(self.params, self.results(outputs, ctxs, reduction), sparse):
            if was_sparse:
                write_sparse(p, out, True)
            elif out.data_ptr() != p.grad.data_ptr():  # type: ignore[union-attr]  # not reduced in place
                grads.append(p.grad)  # type: ignore[arg-type]
                values.append(out)
        if grads:
            with torch.no_grad():
                torch._foreach_copy_(grads, values)


def plan_buckets(params: list[torch.Tensor], names: dict[torch.Tensor, str], cap: int) -> tuple[list[Bucket], bool]:
    """``params`` (in registration order) in buckets, as DDP's: in the order backward makes their gradients
    (reverse registration), one dtype and device each; and whether their allreduces can run beside the backward
    pass (:func:`~hora._frontend.gradients.beside_backward`): then the first bucket is small and each bucket goes
    as soon as its gradients are ready, else every bucket goes when backward ends (:class:`AtBackwardEnd`)."""
    ready_order = params[::-1]
    sizes = [p.numel() * p.element_size() for p in ready_order]
    kinds = [(p.dtype, p.device) for p in ready_order]
    on_gpu = any(p.device.type != "cpu" for p in ready_order)
    beside = beside_backward(on_gpu, torch.get_num_threads(), local_size(), usable_cpus())
    groups = [[ready_order[i] for i in b] for b in buckets(sizes, cap, first_bucket(cap, beside), kinds=kinds)]
    return [Bucket(g, f"bucket.{names[g[0]]}") for g in groups], beside


class AtBackwardEnd:
    """Every bucket submitted once, when the backward pass ends: where no allreduce can run beside the backward
    pass, submitting a bucket earlier gains nothing, and a Python hook per gradient costs ~3 us each (measured in
    docs/performance.md, "Buckets at the end of backward"). A hook on a bucket's first and last gradient queues a
    callback at the end of the autograd graph task it fires in (``queue_callback``, as DDP's reducer does). The
    callback of the outermost task counts the pass and, at the ``backward_passes_per_step``-th, calls ``submit``;
    that of a task nested in another one's node (reentrant activation checkpointing runs a backward inside a
    backward) is ignored, since the outer task still has gradients to compute. A hook firing after the pass that
    submitted raises, as Horovod's per-gradient hooks do. Buckets that no outermost callback submitted (none of the
    hooked gradients was computed outside a nested task) go in ``synchronize``.
    """

    def __init__(self, passes: Callable[[], int], submit: Callable[[], None], too_many: str) -> None:
        self._needed, self._submit, self._too_many = passes, submit, too_many
        self.passes = 0  # backward passes since the last synchronize
        self._queued: set[int] = set()  # the autograd graph tasks whose end has a callback

    def hook(self, _p: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        if task in self._queued:
            return
        if self.passes >= self._needed():
            raise AssertionError(self._too_many)
        self._queued.add(task)
        torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _end(self) -> None:
        self._queued.discard(torch._C._current_graph_task_id())
        if torch._C._current_autograd_node() is not None:  # a nested task: the node that started it still runs
            return
        self.passes += 1
        if self.passes == self._needed():
            self._submit()

    def reset(self) -> None:
        self.passes = 0
        self._queued.clear()

    @staticmethod
    def hooked(planned: list[Bucket]) -> list[torch.Tensor]:
        """The parameters to hook: each bucket's first and last in the order backward makes them."""
        return list({id(p): p for b in planned for p in (b.params[0], b.params[-1])}.values())


def _views_of(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut into views shaped as ``params``, in order."""
    return [piece.view(p.shape) for piece, p in zip(flat.split([p.numel() for p in params]), params)]


def hold_gradients_in_buckets(planned: list[Bucket] | None, reduction: GradientReduction) -> None:
    """``gradient_as_bucket_view=True`` (DDP's): the small gradients of every bucket live in its buffer."""
    if planned is None:
        raise ValueError(
            "gradient_as_bucket_view=True needs the optimizer's buckets: strategy='allreduce', an op other than "
            "Adasum, no groups= or num_groups=, and HORA_BUCKET_CAP above 0 "
            f"(here: strategy={reduction.strategy!r}, groups={reduction.groups!r})"
        )
    for b in planned:
        b.as_views = True


def zero_grad_holding_views(
    zero_grad: Callable[[bool], None], optimizer: Any, planned: list[Bucket], set_to_none: bool
) -> None:
    """``zero_grad`` (the wrapped optimizer's) for every gradient but those living in their bucket
    (gradient_as_bucket_view), which are zeroed there and stay views of it, as with ``set_to_none=False``."""
    held: dict[torch.Tensor, torch.Tensor] = {}
    for b in planned:
        held.update(b.held())
    if not held:
        zero_grad(set_to_none)
        return
    groups = optimizer.param_groups
    optimizer.param_groups = [{**g, "params": [p for p in g["params"] if p not in held]} for g in groups]
    try:
        zero_grad(set_to_none)
    finally:
        optimizer.param_groups = groups
    with torch.no_grad():
        for b in planned:
            if b.as_views and b._flat is not None:
                b._flat.zero_()
