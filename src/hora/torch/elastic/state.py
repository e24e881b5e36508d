"""Horovod's ``TorchState``: models, optimizers and :class:`ElasticSampler` s kept by handlers (saved as deep copies of
their state dicts, synced by broadcast from rank 0), every other keyword an object attribute."""

from __future__ import annotations

import copy
from typing import Any

import torch

from hora._frontend.elastic import ObjectState
from hora._frontend.surface import rank
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.functions import broadcast_optimizer_state, broadcast_parameters
from hora.torch.mpi_ops import broadcast_object

__all__ = [
    "ModelStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "StateHandler",
    "TorchState",
    "get_handler_registry",
    "set_handler_registry",
]


class StateHandler:
    """Keeps one value of a :class:`TorchState`: ``save``, ``restore``, ``sync``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with ``state_dict()`` / ``load_state_dict()``: saved as a deep copy of its state dict."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_handler_registry: list[tuple[type, type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """(type, handler class) pairs, the first match wins (Horovod's hook for custom state)."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    global _handler_registry
    _handler_registry = registry


def _handler(value: Any) -> StateHandler | None:
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training loop: ``model``, ``optimizer`` and any other keyword (more models,
    optimizers, samplers, or plain objects such as ``epoch=0, batch=0``), each exposed as an attribute."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {k: h for k, v in kwargs.items() if (h := _handler(v)) is not None}
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        rest = {k: v for k, v in kwargs.items() if k not in handlers}
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **rest)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, name) and name in self.__dict__.get("_handlers", {}):
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)
