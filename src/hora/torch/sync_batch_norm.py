"""``SyncBatchNorm``: batch normalisation over the whole global batch, with Horovod's name and arguments.

In training, every rank computes the per-channel count, sum and sum of squares of its own batch; one allreduce
(Sum) of those three makes them global, and the batch is normalised with the global mean and (biased) variance.
The allreduce is differentiable (its backward allreduces the gradient of the statistics), so gradients are those
of the global batch. Running statistics are updated with the global mean and unbiased variance, so every rank's
running statistics stay identical. In eval mode, or on a single rank, it is ``torch.nn.BatchNorm*``.
"""

from __future__ import annotations

import itertools

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hora._frontend.surface import Sum, size
from hora.torch.mpi_ops import allreduce

_instances = itertools.count()


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation synchronised across ranks (``horovod.torch.SyncBatchNorm``); takes inputs of shape
    ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` or more spatial dimensions."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        # modules are built in the same order on every rank, so this name matches across ranks and the engine's
        # response cache answers the statistics' allreduce after the first step
        self._hora_name = f"sync_batch_norm.{next(_instances)}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)

        factor = 0.0
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum

        c = input.shape[1]
        dims = [0, *range(2, input.dim())]
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.full((1,), input.numel() // c, dtype=x.dtype, device=x.device)
        stats = torch.cat([count, x.sum(dims), (x * x).sum(dims)])
        total = allreduce(stats, op=Sum, name=self._hora_name)
        n = total[0]
        if float(n) <= 1:
            raise ValueError(f"SyncBatchNorm needs more than 1 value per channel across all ranks, got {int(n)}")
        mean = total[1 : 1 + c] / n
        var = (total[1 + c :] / n - mean * mean).clamp_min(0.0)

        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach().to(self.running_mean.dtype), alpha=factor)
                unbiased = var.detach() * (n / (n - 1))
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)

        shape = [1, c] + [1] * (input.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)


__all__ = ["SyncBatchNorm"]
