"""``DistributedOptimizer(optimizer, ...)``: checks Horovod's arguments and builds the wrapper they ask for, a
subclass of the wrapped optimizer's class on its ``param_groups``: gradients allreduced by hooks
(:mod:`hora.torch.optimizer`), each rank's local step combined with Adasum (:mod:`hora.torch.adasum_optimizer`),
or the update on parameter servers (:mod:`hora.torch.ps_optimizer`, :mod:`hora.torch.hybrid`)."""

from __future__ import annotations

from typing import Any

import torch

from hora._frontend.gradients import describe_gradients
from hora._frontend.surface import Adasum, Average, ProcessSet, global_process_set, size
from hora._strategy import STRATEGIES
from hora.errors import UnsupportedError
from hora.torch.buckets import hold_gradients_in_buckets
from hora.torch.compression import Compression
from hora.torch.optimizer import _DistributedOptimizer


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    strategy: str | None = None,
    staleness: int | None = None,
    consistency: str | None = None,
    ps_parameters: Any = None,
    gradient_as_bucket_view: bool = False,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged (``op``) over every rank.

    Arguments are Horovod's: ``named_parameters`` names each gradient's collective (recommended: ranks then agree
    by name); ``compression`` (``Compression.fp16`` halves the bytes); ``backward_passes_per_step`` accumulates
    that many backward passes locally before communicating; ``gradient_predivide_factor`` splits the averaging
    into a division before and after the sum; ``groups`` (an int, or lists of parameters) allreduces parameters
    in fixed groups; ``sparse_as_dense`` densifies sparse gradients instead of allgathering them.

    hora's own: ``strategy="parameter_server"`` (default: ``HORA_STRATEGY``, ``allreduce``) runs the update on the
    job's parameter servers (``hora run --num-ps S``) instead, with ``staleness=k`` for ``bounded(k)`` or
    ``consistency`` (``async``, ``sync``, ``bounded(k)``; default ``HORA_PS_CONSISTENCY``).
    ``strategy="hybrid"`` keeps ``ps_parameters`` (the model: its ``nn.Embedding(sparse=True)`` weights; or
    modules, parameters, names) on the servers, updated row by row, and allreduces the rest; see docs/ps.md.
    ``gradient_as_bucket_view=True`` (DDP's): each gradient under 128 KiB lives in its bucket's buffer (no copy
    in or out; ``zero_grad`` zeroes it there, and a ``p.grad`` kept from one step changes with the next).
    """
    reduction = describe_gradients(
        "hora.torch.DistributedOptimizer",
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=groups,
        num_groups=num_groups,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        process_set=process_set,
        backward_passes_per_step=backward_passes_per_step,
        strategy=strategy,
        strategies=STRATEGIES,
        staleness=staleness,
        consistency=consistency,
        ps_parameters=ps_parameters,
        adasum=True,
    )
    if reduction.strategy == "parameter_server":
        from hora.torch.ps_optimizer import make_ps_optimizer

        return make_ps_optimizer(optimizer, named_parameters, staleness, consistency)
    members = dict(_DistributedOptimizer.__dict__)
    if reduction.op is Adasum and size() > 1:  # Horovod's: one rank uses the ordinary optimizer
        from hora.torch.adasum_optimizer import adasum_members

        if reduction.groups is not None or sparse_as_dense:  # Horovod ignores them
            raise UnsupportedError(
                "hora.torch.DistributedOptimizer: op=Adasum reduces each parameter's local step on its own; leave "
                "groups= and sparse_as_dense out"
            )
        members = adasum_members()
    if reduction.strategy == "hybrid":
        from hora.torch.hybrid import hybrid_members

        if reduction.groups is not None:
            raise UnsupportedError("groups= is not supported with strategy='hybrid' yet; leave it out")
        if named_parameters is None:
            raise ValueError("strategy='hybrid' needs named_parameters (the servers keep variables by name)")
        named_parameters = list(named_parameters)
        members.update(hybrid_members(optimizer, named_parameters, ps_parameters, staleness, consistency))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), members)
    wrapped = cls(optimizer.param_groups, named_parameters, reduction)
    if gradient_as_bucket_view:
        hold_gradients_in_buckets(getattr(wrapped, "_buckets", None), reduction)
    return wrapped
