"""``DistributedOptimizer(..., strategy="hybrid")``: embeddings on the parameter servers, everything else on
allreduce.

The parameters named by ``ps_parameters`` (by default, given a model, the weights of its ``nn.Embedding`` /
``nn.EmbeddingBag`` layers built with ``sparse=True``) are registered on the job's servers with the server rule of
the wrapped optimizer (worker 0's values; every worker pulls them back, so all start equal). Every other parameter
is averaged by allreduce exactly as the allreduce ``DistributedOptimizer`` does (same hooks, same arguments) and
stepped by the wrapped optimizer on each worker.

Each ``step()``, for each server-held parameter: the worker's touched rows (the sparse gradient's indices, summed
per row) are pushed with ``push_rows``; the ids every worker touched are allgathered (ids only, 8 bytes a row), and
exactly those rows are pulled back into the worker's local table. Under ``sync`` the servers apply the step's N
pushes at once (rows summed in rank order, divided by N), which is what averaging the gradients does, so the
local table equals the servers' after every step; under ``async`` each push is applied on arrival (N updates a
step). The local table is a replica of the servers' kept current row by row; only touched rows cross the wire.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hora._strategy import check_mode, exchange_rows
from hora.errors import UnsupportedError

__all__ = ["HybridSettings", "hybrid_members", "select_ps_parameters"]

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


@dataclass
class HybridSettings:
    """What a hybrid optimizer keeps on the servers: (name, parameter) pairs, the client, the consistency mode."""

    params: list[tuple[str, torch.Tensor]]
    client: Any
    mode: str
    ids: set[int] = field(default_factory=set)


def select_ps_parameters(
    named: list[tuple[str, torch.Tensor]], ps_parameters: Any
) -> list[tuple[str, torch.Tensor]]:
    """The (name, parameter) pairs ``ps_parameters`` picks: parameter names, tensors, embedding modules, or a model
    (its ``sparse=True`` embeddings)."""
    if ps_parameters is None:
        raise ValueError(
            "strategy='hybrid' needs ps_parameters=: the model (its nn.Embedding(sparse=True) layers go to the "
            "servers), embedding modules, parameters or parameter names"
        )
    by_id = {id(p): n for n, p in named}
    by_name = dict(named)
    items = (
        [ps_parameters]
        if isinstance(ps_parameters, (str, torch.Tensor, torch.nn.Module))
        else list(ps_parameters)
    )
    chosen: set[str] = set()
    for item in items:
        if isinstance(item, str):
            if item not in by_name:
                raise ValueError(
                    f"ps_parameters names '{item}', which is not in named_parameters ({sorted(by_name)[:8]} ...)"
                )
            chosen.add(item)
        elif isinstance(item, torch.Tensor):
            if id(item) not in by_id:
                raise ValueError(
                    "ps_parameters holds a tensor that is not one of the optimizer's named parameters"
                )
            chosen.add(by_id[id(item)])
        elif isinstance(item, torch.nn.Module):
            layers = (
                [item]
                if isinstance(item, _EMBEDDINGS)
                else [m for m in item.modules() if isinstance(m, _EMBEDDINGS) and m.sparse]
            )
            if not layers:
                raise ValueError(
                    f"ps_parameters: the {type(item).__name__} has no nn.Embedding/EmbeddingBag with sparse=True; "
                    "build the embeddings with sparse=True or name the parameters to put on the servers"
                )
            for m in layers:
                if id(m.weight) not in by_id:
                    raise ValueError(f"ps_parameters: the weight of {m} is not one of the optimizer's named parameters")
                chosen.add(by_id[id(m.weight)])
        else:
            raise ValueError(f"ps_parameters must hold names, tensors or modules, got {type(item).__name__}")
    return [(n, p) for n, p in named if n in chosen]


def _rows_of(p: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(unique sorted row ids, their summed gradient rows) of ``p.grad``; dense gradients give their nonzero rows."""
    g = p.grad
    if g is None:
        return np.zeros(0, np.int64), np.zeros((0, *p.shape[1:]), p.detach().numpy().dtype)
    if not g.is_sparse:
        g = g.to_sparse(sparse_dim=1)
    g = g.coalesce()
    ids = g.indices()[0].numpy().astype(np.int64)
    return ids, np.ascontiguousarray(g.values().numpy())


class _HybridMixin(torch.optim.Optimizer):
    """Methods that replace the allreduce optimizer's where the server-held parameters differ."""

    _hora_hybrid: HybridSettings
    _synchronized: bool
    _should_synchronize: bool

    def _register_hooks(self) -> None:
        held = self._hora_hybrid.ids
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in held:
                    self._requires_update.add(p)  # type: ignore[attr-defined]
                    hook = self._make_hook(p)  # type: ignore[attr-defined]
                    self._hooks.append(p.register_post_accumulate_grad_hook(hook))  # type: ignore[attr-defined]

    def _hora_union(self, name: str, ids: np.ndarray) -> np.ndarray:
        from hora._frontend.surface import size
        from hora.torch.mpi_ops import allgather

        if size() == 1:
            return ids
        gathered = allgather(torch.from_numpy(ids), name=f"hybrid.rows.{name}")
        return np.unique(gathered.numpy())

    def _hora_exchange_rows(self) -> None:
        h = self._hora_hybrid
        for name, p in h.params:
            ids, rows = _rows_of(p)
            union, values = exchange_rows(h.client, name, h.mode, ids, rows, functools.partial(self._hora_union, name))
            if len(union):
                with torch.no_grad():
                    p.index_copy_(0, torch.from_numpy(union), torch.from_numpy(values))

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown.",
                    stacklevel=2,
                )
            self.synchronize()  # type: ignore[attr-defined]
        self._synchronized = False
        self._hora_exchange_rows()
        held = [(p, p.grad) for _, p in self._hora_hybrid.params]
        # the servers updated these: the local optimizer skips parameters without a gradient
        for p, _ in held:
            p.grad = None
        try:
            return super(self.__class__, self).step(closure)
        finally:
            for p, g in held:
                p.grad = g


def hybrid_members(
    optimizer: torch.optim.Optimizer,
    named: list[tuple[str, torch.Tensor]],
    ps_parameters: Any,
    staleness: int | None,
    consistency: str | None,
) -> dict[str, Any]:
    """The class members that make an allreduce ``DistributedOptimizer`` class hybrid; registers the server-held
    parameters (worker 0's values) and pulls them into every worker's tensors."""
    from hora._strategy import resolve_consistency
    from hora.ps.discovery import shared_client
    from hora.torch.ps_optimizer import rule_of

    chosen = select_ps_parameters(named, ps_parameters)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    rules = {}
    for n, p in chosen:
        if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.float64) or p.dim() < 1:
            raise UnsupportedError(
                f"parameter '{n}' is a {p.dtype} tensor on {p.device}; the servers hold CPU float32/float64 arrays"
            )
        if id(p) not in group_of:
            raise ValueError(f"ps_parameters: '{n}' is not in the optimizer's parameter groups")
        rules[n] = rule_of(optimizer, group_of[id(p)])
    client = shared_client()
    mode = check_mode(resolve_consistency(client, staleness, consistency))
    for n, p in chosen:
        if not p.is_contiguous():
            raise UnsupportedError(f"parameter '{n}' is not contiguous; the servers' rows are copied into it in place")
        client.register(n, p.detach().numpy(), rule=rules[n], consistency=mode)
    for n, p in chosen:  # every worker starts from worker 0's table
        with torch.no_grad():
            client.pull(n, out=p.detach().numpy())
    settings = HybridSettings(chosen, client, mode, {id(p) for _, p in chosen})
    members = {
        k: v for k, v in _HybridMixin.__dict__.items() if k not in ("__dict__", "__weakref__", "__module__", "__doc__")
    }
    members["_hora_hybrid"] = settings
    return members
