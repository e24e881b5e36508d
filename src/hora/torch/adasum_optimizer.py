"""``DistributedOptimizer(op=hvd.Adasum)``: Horovod's ``_DistributedAdasumOptimizer``, which combines *steps*, not
gradients.

Adasum needs the update each rank would make on its own: the moment a parameter's gradient is accumulated (the
``backward_passes_per_step``-th time), its hook runs the wrapped optimizer's step on that parameter alone, from a
saved copy ``start`` of it, turns the parameter into the local step ``delta = p - start`` and starts an in-place
Adasum allreduce of it. ``step()`` then waits for every delta and sets ``p = start + adasum(delta)``. So optimizer
state (momentum, Adam's moments) stays per rank and is driven by the local gradient, as in Horovod. With one rank
Horovod (and hora) use the ordinary optimizer.

Differences from Horovod: deltas of parameters whose gradient never came are submitted in name order (Horovod: set
order, different on each rank), and ``groups=`` and ``sparse_as_dense`` are refused (Horovod ignores them).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from hora._frontend.gradients import GradientReduction
from hora._frontend.surface import Adasum
from hora.torch.mpi_ops import allreduce_async_, synchronize
from hora.torch.optimizer import _DistributedOptimizer

__all__ = ["adasum_members"]


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    def __init__(self, params: Any, named_parameters: Any, reduction: GradientReduction) -> None:
        _DistributedOptimizer.__init__(self, params, named_parameters, reduction)
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in self._parameter_names}

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()  # Horovod's: a parameter the forward skips steps on zeros
                    self._requires_update.add(p)
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        """The wrapped optimizer's step on ``p`` alone, from ``start``; then ``p`` holds the local step, reduced in
        place with Adasum."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p)
            super(self.__class__, self).step()
            p.data.sub_(start)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, ctx = self._compression.compress(p)
        handle = allreduce_async_(compressed.data, name=self._parameter_names.get(p), op=Adasum)
        return handle, ctx

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*ignore: Any) -> None:
            if self._allreduce_delay[p] <= 0:  # reset by step(): this backward pass is one too many
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally."
                )
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        pass  # Horovod's: the deltas are waited for in step()

    @contextmanager
    def skip_synchronize(self) -> Any:
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        names = self._parameter_names
        for p in sorted(self._requires_update - set(self._handles), key=lambda q: names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if handle is None:  # step() before backward_passes_per_step passes: reduce what there is now
                handle, ctx = self._allreduce_grad_async(p)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss


def adasum_members() -> dict[str, Any]:
    """The members of the class ``DistributedOptimizer(op=Adasum)`` builds over the wrapped optimizer's class."""
    return {**_DistributedOptimizer.__dict__, **_DistributedAdasumOptimizer.__dict__}
