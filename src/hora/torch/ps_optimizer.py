"""``DistributedOptimizer(..., strategy="parameter_server")``: the wrapped optimizer's update runs on the parameter
servers instead of on every rank after an allreduce.

The optimizer is translated into a server rule (data, not code): ``SGD`` (with or without momentum, Nesterov),
``Adagrad`` and ``Adam``, each parameter group with its own hyperparameters. At construction every parameter is
registered on the servers (the first worker's values win) and pulled back, so every worker starts from the same
values; ``step()`` pushes each gradient and pulls the updated parameter into the tensor's own memory.
"""

from __future__ import annotations

from typing import Any

import torch

from hora.errors import UnsupportedError

__all__ = ["make_ps_optimizer", "rule_of"]


def rule_of(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> dict[str, Any]:
    """The server rule equivalent to ``optimizer``'s update for one parameter group."""
    name = type(optimizer).__name__
    if group.get("weight_decay", 0):
        raise UnsupportedError(
            f"{name} with weight_decay={group['weight_decay']} has no parameter-server rule yet; use weight_decay=0"
        )
    if group.get("maximize"):
        raise UnsupportedError(f"{name}(maximize=True) has no parameter-server rule; negate the loss instead")
    lr = float(group["lr"])
    if isinstance(optimizer, torch.optim.SparseAdam):  # a lazy Adam: the servers' sparse Adam is one too
        b1, b2 = group["betas"]
        return {
            "rule": "adam",
            "lr": lr,
            "beta1": float(b1),
            "beta2": float(b2),
            "epsilon": float(group["eps"]),
        }
    if isinstance(optimizer, torch.optim.SGD):
        if group.get("dampening", 0):
            raise UnsupportedError("SGD with dampening has no parameter-server rule; use dampening=0")
        if group.get("momentum", 0):
            return {
                "rule": "momentum",
                "lr": lr,
                "momentum": float(group["momentum"]),
                "nesterov": bool(group.get("nesterov")),
            }
        return {"rule": "sgd", "lr": lr}
    if isinstance(optimizer, torch.optim.Adagrad):
        if group.get("lr_decay", 0):
            raise UnsupportedError("Adagrad with lr_decay has no parameter-server rule; use lr_decay=0")
        return {
            "rule": "adagrad",
            "lr": lr,
            "initial_accumulator": float(group.get("initial_accumulator_value", 0.0)),
            "epsilon": float(group["eps"]),
        }
    if isinstance(optimizer, torch.optim.Adam) and not isinstance(optimizer, torch.optim.AdamW):
        if group.get("amsgrad"):
            raise UnsupportedError("Adam(amsgrad=True) has no parameter-server rule; use amsgrad=False")
        b1, b2 = group["betas"]
        return {
            "rule": "adam",
            "lr": lr,
            "beta1": float(b1),
            "beta2": float(b2),
            "epsilon": float(group["eps"]),
        }
    raise UnsupportedError(
        f"strategy='parameter_server' runs the update on the servers, which know SGD (momentum, Nesterov), Adagrad, "
        f"Adam and SparseAdam; {name} is not one of them. Use one of those, or strategy='allreduce'"
    )


class _PSOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params: Any,
        named: list[tuple[str, torch.Tensor]],
        rules: dict[str, dict[str, Any]],
        client: Any,
        consistency: str,
    ) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        self._ps = client
        self._names = {id(p): n for n, p in named}
        for n, p in named:
            if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.float64):
                raise UnsupportedError(
                    f"parameter '{n}' is a {p.dtype} tensor on {p.device}; "
                    "the parameter servers hold CPU float32/float64"
                )
        for n, p in named:
            data = p.detach().numpy()
            self._ps.register(n, data, rule=rules[n], consistency=consistency)
        for n, p in named:  # every worker starts from the values the servers kept (the first registration's)
            with torch.no_grad():
                self._ps.pull(n, out=_view(p))

    def synchronize(self) -> None:
        """Nothing to wait for: the exchange happens in :meth:`step`."""

    def skip_synchronize(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.is_sparse:
                        raise UnsupportedError(
                            "sparse gradients with strategy='parameter_server' are not supported yet"
                        )
                    name = self._names[id(p)]
                    self._ps.push_pull(name, p.grad.detach().contiguous().numpy(), out=_view(p))
        return loss


def _view(p: torch.Tensor) -> Any:
    if not p.is_contiguous():
        raise UnsupportedError("a non-contiguous parameter cannot be updated in place by the parameter servers")
    return p.detach().numpy()


def make_ps_optimizer(
    optimizer: torch.optim.Optimizer, named_parameters: Any, staleness: int | None, consistency: str | None
) -> torch.optim.Optimizer:
    """The parameter-server form of ``optimizer`` (see the module docstring)."""
    from hora._strategy import resolve_consistency
    from hora.ps.discovery import shared_client

    if named_parameters is not None:
        named = list(named_parameters)
    else:
        named = [
            (f"ps.noname.{i}.{j}", p) for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])
        ]
    ids = {id(p): n for n, p in named}
    rules: dict[str, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in ids:
                raise ValueError("named_parameters was specified, but one or more model parameters were not named")
            rules[ids[id(p)]] = rule_of(optimizer, group)
    client = shared_client()
    consistency = resolve_consistency(client, staleness, consistency)
    named = [(n, p) for n, p in named if p.requires_grad]
    cls = type(type(optimizer).__name__, (type(optimizer),), dict(_PSOptimizer.__dict__))
    return cls(optimizer.param_groups, named, rules, client, consistency)
