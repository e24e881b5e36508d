"""Start every rank from the same state: ``broadcast_parameters`` and ``broadcast_optimizer_state`` (Horovod's
names), plus ``broadcast_object`` / ``allgather_object`` re-exported from :mod:`hora.torch.mpi_ops`."""

from __future__ import annotations

import collections.abc
from typing import Any

import torch

from hora._frontend.surface import ProcessSet, global_process_set, rank
from hora.torch.distributed_optimizer import DistributedOptimizer
from hora.torch.mpi_ops import broadcast_async_, broadcast_object, synchronize


def broadcast_parameters(params: Any, root_rank: int, process_set: ProcessSet = global_process_set) -> None:
    """Overwrite, in place, every rank's parameters with ``root_rank``'s.

    ``params``: a ``state_dict()`` (or any mapping of names to tensors), ``model.named_parameters()`` (pairs of
    name and tensor), or a list of tensors. Names make the collectives of the ranks match; a mapping is sorted
    by name first, as Horovod does, so ranks that built their dicts in a different order still agree.
    """
    if isinstance(params, collections.abc.Mapping):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, (list, tuple, collections.abc.Iterator)):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for i, (name, p) in enumerate(items):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(
                f"broadcast_parameters: {name or f'entry {i}'!s} is a {type(p).__name__}, not a tensor; "
                "broadcast other values with broadcast_object"
            )
        label = f"broadcast_parameters.{name}" if name is not None else f"broadcast_parameters.{i}"
        handles.append(broadcast_async_(p, root_rank, label, process_set=process_set))
    for h in handles:
        synchronize(h)


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Horovod 0.28's (horovod/torch/functions.py): a new optimizer has no state yet, so every parameter that
    requires a gradient gets a zero one (sparse for SparseAdam; an existing gradient is replaced, as Horovod
    does) and the optimizer takes one step to create its state. A DistributedOptimizer steps as the wrapped
    optimizer, without allreduces (they would need every rank to step). Like Horovod, the parameters are not
    restored: a zero-gradient step leaves them unchanged unless the optimizer decays weights."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    if type(optimizer).__module__ == DistributedOptimizer.__module__:
        super(optimizer.__class__, optimizer).step()  # type: ignore[misc]
    else:
        optimizer.step()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, process_set: ProcessSet = global_process_set
) -> None:
    """Make every rank's optimizer state (its per-parameter tensors such as momentum buffers and Adam moments,
    its step counts and every hyper-parameter of every param group) equal ``root_rank``'s.

    Works for any ``torch.optim.Optimizer``: the root's ``state_dict()`` is sent as a structure (small, by
    ``broadcast_object``) plus its tensors (by in-place broadcasts, no pickling of the data), and the other ranks
    ``load_state_dict`` it. Ranks whose optimizers do not have the same parameter groups get torch's own error.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer)
    root = rank() == root_rank
    state = optimizer.state_dict() if root else None
    tensors: list[torch.Tensor] = []

    def strip(obj: Any) -> Any:  # tensors -> placeholders (shape, dtype) in the structure sent as an object
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
            return (
                "__hora_tensor__",
                len(tensors) - 1,
                tuple(obj.shape),
                str(obj.dtype).replace("torch.", ""),
            )
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(strip(v) for v in obj)
        return obj

    skeleton = broadcast_object(
        strip(state) if root else None,
        root_rank,
        "broadcast_optimizer_state.structure",
        process_set=process_set,
    )
    received: list[torch.Tensor] = []

    def fill(obj: Any) -> Any:  # placeholders -> tensors to receive into
        if isinstance(obj, tuple) and len(obj) == 4 and obj[0] == "__hora_tensor__":
            t = torch.empty(obj[2], dtype=getattr(torch, obj[3]))
            received.append(t)
            return t
        if isinstance(obj, dict):
            return {k: fill(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(fill(v) for v in obj)
        return obj

    sources = tensors if root else received
    new_state = None if root else fill(skeleton)
    handles = [
        broadcast_async_(
            t if t.is_contiguous() else t.contiguous(),
            root_rank,
            f"broadcast_optimizer_state.{i}",
            process_set=process_set,
        )
        for i, t in enumerate(sources)
    ]
    for h in handles:
        synchronize(h)
    if not root:
        optimizer.load_state_dict(new_state)  # type: ignore[arg-type]
