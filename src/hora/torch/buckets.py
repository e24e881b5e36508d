"""Gradient buckets of ``hora.torch.DistributedOptimizer``, as DDP's: the gradients of one bucket travel as one
flat tensor, so a step of hundreds of small gradients costs a handful of collectives, not hundreds.

When the last gradient of a bucket is ready, the bucket's gradients are copied into the bucket's own buffer (one
``torch._foreach_copy_`` into views of it), compressed, and the buffer is allreduced in place; ``synchronize``
copies the result back into each ``p.grad`` (one ``torch._foreach_copy_``). ``p.grad`` never aliases the buffer,
which the next step reuses. Every gradient of a bucket has one dtype and device (``buckets(..., kinds=...)``).
"""

from __future__ import annotations

from typing import Any

import torch

from hora._frontend.gradients import GradientReduction
from hora.torch.mpi_ops import allreduce_async_


class Bucket:
    """One bucket: its parameters (in the order their gradients become ready), its reusable flat buffer and the
    buffer's views shaped as each parameter (made once: per-step Python work per gradient is what buckets save)."""

    def __init__(self, params: list[torch.Tensor], name: str) -> None:
        self.params = params
        self.name = name
        self._flat: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []

    def leave(self, p: torch.Tensor) -> None:
        self.params = [q for q in self.params if q is not p]
        self._flat = None  # the layout changed

    def submit(self, grads: list[torch.Tensor], reduction: GradientReduction) -> tuple[Any, Any]:
        """Start the bucket's allreduce of ``grads`` (dense, one per parameter, in ``params`` order): (handle,
        the compression's context)."""
        flat = self._flat
        if flat is None or flat.dtype != grads[0].dtype or flat.device != grads[0].device:
            flat = self._flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)
            self._views = _views_of(flat, self.params)
        with torch.no_grad():
            torch._foreach_copy_(self._views, grads)
        compressed, ctx = reduction.compression.compress(flat)
        handle = allreduce_async_(
            compressed,
            name=self.name,
            op=reduction.op,
            prescale_factor=reduction.prescale,
            postscale_factor=reduction.postscale,
            process_set=reduction.process_set,
        )
        return handle, ctx

    def results(self, output: torch.Tensor, ctx: Any, reduction: GradientReduction) -> list[torch.Tensor]:
        """The reduced gradients, views of the bucket's buffer in ``params`` order: copy them out before the
        bucket's next ``submit``."""
        flat = reduction.compression.decompress(output, ctx)
        if self._flat is not None and flat.data_ptr() == self._flat.data_ptr():
            return self._views
        return _views_of(flat, self.params)


def _views_of(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut into views shaped as ``params``, in order."""
    return [piece.view(p.shape) for piece, p in zip(flat.split([p.numel() for p in params]), params)]
