"""The wrapper ``DistributedOptimizer`` builds by default: Horovod's, averaging gradients across ranks as backward
runs.

By default the gradients go in buckets, as DDP's (:mod:`hora.torch.buckets`, ``bucket_cap``): each bucket is
allreduced as one flat tensor. Where an allreduce can run beside the backward pass (gradients on an accelerator,
or a spare core per rank), a hook on every parameter (``register_post_accumulate_grad_hook``) notes its gradient
the moment autograd has accumulated it, and a bucket goes as soon as its last gradient is ready; elsewhere every
bucket goes when the backward pass ends (:class:`~hora.torch.buckets.AtBackwardEnd`: a few hooks, one callback).
With ``groups=`` (Horovod's) a group goes as one grouped allreduce once all its gradients are ready; with
``bucket_cap`` 0, each gradient as its own allreduce (Horovod's default). ``step()`` waits for all of them
(``synchronize()``) and then runs the wrapped optimizer's own step. Semantics follow ``horovod/torch/optimizer.py``:
the object is an instance of a subclass of the wrapped optimizer's class built on its ``param_groups``; gradient
names come from ``named_parameters``; ``backward_passes_per_step`` accumulates locally before communicating.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hora._frontend.gradients import GradientReduction, bucket_cap, parameter_differences
from hora._frontend.surface import Adasum, size
from hora.config import launchers
from hora.torch.buckets import AtBackwardEnd, Bucket, plan_buckets, zero_grad_holding_views
from hora.torch.mpi_ops import (
    allgather_object,
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)

TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Any, named_parameters: Any, reduction: GradientReduction) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        self._reduction = reduction
        self._compression = reduction.compression

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [
                (f"allreduce.noname.{i}.{j}", v)
                for i, param_group in enumerate(self.param_groups)
                for j, v in enumerate(param_group["params"])
            ]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError(
                "named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                "model.named_parameters()."
            )
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError(
                "Parameter names in named_parameters must be unique. Found duplicates: " + ", ".join(dups)
            )
        all_param_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_param_ids = {id(v) for _, v in named_parameters}
        unnamed = all_param_ids - named_param_ids
        if unnamed:
            raise ValueError(
                "named_parameters was specified, but one or more model parameters were not named. Python "
                "object ids: " + ", ".join(str(i) for i in sorted(unnamed))
            )

        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step = reduction.backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = reduction.op
        self.gradient_predivide_factor = reduction.predivide
        self.sparse_as_dense = reduction.sparse_as_dense
        self.process_set = process_set = reduction.process_set
        self._handles: dict[Any, tuple[Any, Any]] = {}
        self._hooks: list[Any] = []
        self._requires_update: set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True

        # groups: an int (split the parameters into that many groups) or lists of parameters (one not listed is a
        # group of its own); each group is allreduced as one grouped collective once all its gradients are ready
        self._groups: list[list[torch.Tensor]] | None = None
        self._buckets: list[Bucket] | None = None  # the default: self._groups are buckets, each one flat tensor
        self._group_of: dict[torch.Tensor, int] = {}
        self._at_end: AtBackwardEnd | None = None
        if reduction.groups is not None:
            params_in_order = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
            self._groups = reduction.partition(params_in_order, params_in_order)
            for gi, g in enumerate(self._groups):
                for p in g:
                    self._group_of[p] = gi
            self._group_ready: dict[int, set[torch.Tensor]] = {}
        elif reduction.op is not Adasum and reduction.strategy == "allreduce" and (cap := bucket_cap()) > 0:
            # buckets, as DDP's: in the order backward makes the gradients (reverse registration), the first small
            params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
            self._buckets, beside = plan_buckets(params, self._parameter_names, cap)
            if not beside:  # nothing overlaps the backward pass here: every bucket goes when it ends
                self._at_end = AtBackwardEnd(
                    lambda: self.backward_passes_per_step, self._submit_buckets, TOO_MANY_PASSES
                )
            self._groups = [b.params for b in self._buckets]
            self._group_of = {p: gi for gi, g in enumerate(self._groups) for p in g}
            self._group_ready = {}
            self._bucket_count = [0] * len(self._groups)  # gradients ready in each bucket not yet submitted

        # An elastic job may start with one rank and grow: it needs the hooks from the start (as in Horovod).
        if process_set.included() and (size() > 1 or launchers.elastic()):
            self._check_same_parameters(named_parameters)
            self._register_hooks()

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load the wrapped optimizer's state and forget the gradients in flight (Horovod's: after a failed step,
        ``hvd.elastic``'s restore must not find half-submitted allreduces)."""
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        if self._groups is not None:
            self._group_ready = {}
        if self._buckets is not None:
            self._bucket_count[:] = [0] * len(self._buckets)
        if self._at_end is not None:
            self._at_end.reset()
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def _check_same_parameters(self, named_parameters: list[tuple[str, torch.Tensor]]) -> None:
        """Every rank must allreduce the same gradients, or the ranks with an extra one wait for ever: compare the
        (name, shape, dtype) lists once, here, and raise on every rank naming the difference."""
        mine = sorted(
            (k, tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in named_parameters if v.requires_grad
        )
        everyone = allgather_object(mine, name="DistributedOptimizer.parameters", process_set=self.process_set)
        differences = parameter_differences(everyone)
        if differences:
            raise ValueError(
                "DistributedOptimizer: the ranks' parameters differ (compared with rank 0's, by name, shape and "
                f"dtype): {differences}. Every rank must wrap the same model's parameters."
            )

    @staticmethod
    def find_duplicates(lst: list[Any]) -> set[Any]:
        seen: set[Any] = set()
        return {x for x in lst if x in seen or seen.add(x)}  # type: ignore[func-returns-value]

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    # -- hooks -----------------------------------------------------------------------------------------------------
    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    if self._at_end is None:
                        self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
        if self._at_end is not None:
            assert self._buckets is not None
            for p in self._at_end.hooked(self._buckets):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._at_end.hook))

    def _submit_buckets(self) -> None:
        """Every bucket's allreduce, when backward ends (:class:`AtBackwardEnd`); a sparse gradient leaves its
        bucket first and is allgathered on its own, as its hook would do."""
        assert self._groups is not None
        for gi in range(len(self._groups)):
            if not self.sparse_as_dense:
                for p in [p for p in self._groups[gi] if p.grad is not None and p.grad.is_sparse]:
                    self._leave_bucket(p)
                    self._handles[p] = self._allreduce_grad_async(p)
            if self._groups[gi]:
                self._handles[tuple(self._groups[gi])] = self._allreduce_group_async(gi)

    def _dense_grad(self, p: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The gradient to allreduce, and whether ``p.grad`` is sparse (sparse_as_dense: a dense copy is reduced
        and the result goes back into ``p.grad`` sparse, as Horovod does, so e.g. SparseAdam still gets one)."""
        if p.grad is None:
            # not computed on this rank (e.g. a branch the forward pass skipped), but another rank may have it:
            # every rank must submit the tensor, so this one contributes zeros
            p.grad = p.data.new(p.size()).zero_()
        if p.grad.is_sparse:
            return p.grad.to_dense(), True
        return p.grad, False

    @staticmethod
    def _write_grad(p: torch.Tensor, output: torch.Tensor, was_sparse: bool) -> None:
        grad: Any = p.grad
        if was_sparse:  # sparse tensors have no set_: Horovod's equivalent
            grad.zero_().add_(output.to_sparse())
        else:
            grad.set_(output)

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        name = self._parameter_names.get(p)
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            return self._sparse_allreduce_grad_async(p, name), "sparse"
        tensor, was_sparse = self._dense_grad(p)
        compressed, ctx = self._compression.compress(tensor)
        r = self._reduction
        handle = allreduce_async_(
            compressed,
            name=name,
            op=r.op,
            prescale_factor=r.prescale,
            postscale_factor=r.postscale,
            process_set=r.process_set,
        )
        return handle, (compressed, ctx, was_sparse)

    def _sparse_allreduce_grad_async(self, p: torch.Tensor, name: str | None) -> Any:
        """A sparse gradient is allgathered (values and indices) and summed by coalescing, as Horovod does."""
        assert p.grad is not None
        return sparse_allreduce_async(p.grad, name, self.op, self.process_set)

    def _allreduce_group_async(self, gi: int) -> tuple[Any, Any]:
        assert self._groups is not None
        params = self._groups[gi]
        if self._buckets is not None:
            bucket = self._buckets[gi]
            current = [p.grad for p in params]
            sparse: list[bool] | None = None  # every gradient dense and computed: write_back's fast path
            if any(g is None or g.is_sparse for g in current):  # not computed here, or sparse_as_dense
                made = [self._dense_grad(p) for p in params]
                grads, sparse = [g for g, _ in made], [was_sparse for _, was_sparse in made]
            else:
                grads = current  # type: ignore[assignment]  # none is None
            handle, ctx = bucket.submit(grads, self._reduction, sparse)
            return handle, (bucket, ctx, sparse)
        tensors, ctxs = [], []
        for p in params:
            dense, was_sparse = self._dense_grad(p)
            c, ctx = self._compression.compress(dense)
            tensors.append(c)
            ctxs.append((ctx, was_sparse))
        r = self._reduction
        name = self._parameter_names.get(params[0])
        handle = grouped_allreduce_async_(
            tensors,
            name=f"group.{name}",
            op=r.op,
            prescale_factor=r.prescale,
            postscale_factor=r.postscale,
            process_set=r.process_set,
        )
        return handle, (tensors, ctxs)

    def _make_hook(self, p: torch.Tensor) -> Any:
        if self._buckets is not None and p in self._group_of:
            return self._make_bucket_hook(p, self._group_of[p])

        def hook(*_ignore: Any) -> None:
            if self._allreduce_delay[p] <= 0:  # reset by synchronize(): this backward pass is one too many
                raise AssertionError(TOO_MANY_PASSES)
            assert p.grad is None or not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None and p in self._group_of:
                    gi = self._group_of[p]
                    self._group_ready.setdefault(gi, set()).add(p)
                    self._handles[p] = (None, None)
                    self._submit_if_complete(gi)
                    return
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def _make_bucket_hook(self, p: torch.Tensor, gi: int) -> Any:
        """The hook of a gradient in a bucket: a count, and the bucket's allreduce when the count is full. It runs
        once per gradient and step on the backward pass's critical path, so it does no more than that."""
        delay, count, groups = self._allreduce_delay, self._bucket_count, self._groups
        assert groups is not None

        def hook(*_ignore: Any) -> None:
            d = delay[p]
            if d <= 0:  # reset by synchronize(): this backward pass is one too many
                raise AssertionError(TOO_MANY_PASSES)
            delay[p] = d = d - 1
            if d:
                return
            grad = p.grad
            if grad is not None and grad.is_sparse and not self.sparse_as_dense:  # allgathered on its own
                if p in self._group_of:
                    self._leave_bucket(p)
                self._handles[p] = self._allreduce_grad_async(p)
                return
            count[gi] += 1
            if count[gi] == len(groups[gi]):
                count[gi] = 0
                self._handles[tuple(groups[gi])] = self._allreduce_group_async(gi)

        return hook

    def _submit_if_complete(self, gi: int) -> None:
        """Submit group ``gi`` as one grouped allreduce once every gradient in it is ready."""
        assert self._groups is not None
        ready = self._group_ready.get(gi, set())
        if len(ready) == len(self._groups[gi]):
            del self._group_ready[gi]
            for q in self._groups[gi]:
                self._handles.pop(q, None)
            self._handles[tuple(self._groups[gi])] = self._allreduce_group_async(gi)

    def _leave_bucket(self, p: torch.Tensor) -> None:
        """A sparse gradient leaves its default bucket for good (every rank's model makes the same one sparse)."""
        assert self._groups is not None and self._buckets is not None
        gi = self._group_of.pop(p)
        self._buckets[gi].leave(p)
        self._groups[gi] = self._buckets[gi].params
        if self._groups[gi] and self._bucket_count[gi] == len(self._groups[gi]):  # p was the one it waited for
            self._bucket_count[gi] = 0
            self._handles[tuple(self._groups[gi])] = self._allreduce_group_async(gi)

    # -- synchronisation ---------------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every gradient's allreduce and write the averaged gradients into ``p.grad``. Gradients whose
        hook did not fire on this rank (unused parameters) are submitted now, so every rank submits the same set."""
        if not self.process_set.included():
            self._synchronized = True
            return
        covered = sum(len(key) if isinstance(key, tuple) else 1 for key in self._handles)
        if covered < len(self._requires_update) or (self._groups is not None and self._group_ready):
            self._submit_missing()  # else every gradient is in flight (a parameter is in one key at most)
        try:
            for key, (handle, ctx) in self._handles.items():
                if isinstance(key, tuple) and isinstance(ctx[0], Bucket):
                    bucket, cctx, sparse = ctx
                    self._allreduce_delay.update(dict.fromkeys(key, self.backward_passes_per_step))
                    bucket.write_back(synchronize(handle), cctx, self._reduction, sparse, self._write_grad)
                    continue
                if isinstance(key, tuple):
                    outputs = synchronize(handle)
                    _tensors, ctxs = ctx
                    for p, out, (c, was_sparse) in zip(key, outputs, ctxs):
                        self._allreduce_delay[p] = self.backward_passes_per_step
                        self._write_grad(p, self._compression.decompress(out, c), was_sparse)
                    continue
                p = key
                self._allreduce_delay[p] = self.backward_passes_per_step
                if ctx == "sparse":
                    p.grad = synchronize(handle).coalesce()
                    continue
                _compressed, cctx, was_sparse = ctx
                output = synchronize(handle)
                self._write_grad(p, self._compression.decompress(output, cctx), was_sparse)
        finally:
            self._handles.clear()
            if self._buckets is not None:
                self._bucket_count[:] = [0] * len(self._buckets)
            if self._at_end is not None:
                self._at_end.reset()
        self._synchronized = True

    def _submit_missing(self) -> None:
        """Submit what backward did not: groups (buckets) not complete on this rank whole, in group order (the same
        on every rank), then gradients whose hook did not fire, by name; placeholders of a group become requests."""
        completed: set[Any] = set()
        for key in self._handles:
            completed.update(key) if isinstance(key, tuple) else completed.add(key)
        if self._groups is not None:
            pending_groups = sorted(
                {self._group_of[p] for p in self._requires_update - completed if p in self._group_of}
                | set(self._group_ready)
            )
            for gi in pending_groups:
                for q in self._groups[gi]:
                    self._handles.pop(q, None)
                    completed.add(q)
                self._group_ready.pop(gi, None)
                self._handles[tuple(self._groups[gi])] = self._allreduce_group_async(gi)
        for p in sorted(self._requires_update - completed, key=lambda q: self._parameter_names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, _ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Make ``step()`` skip its ``synchronize()``: for code that called ``synchronize()`` itself (e.g. to clip
        the averaged gradients) before ``step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles or (self._buckets is not None and any(self._bucket_count)):
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition."
            )
        if self._buckets is not None and any(b.as_views for b in self._buckets):
            return zero_grad_holding_views(super(self.__class__, self).zero_grad, self, self._buckets, set_to_none)
        return super(self.__class__, self).zero_grad(set_to_none)
