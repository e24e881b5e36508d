"""``hora.torch.elastic`` (Horovod's ``horovod.torch.elastic``): ``run``, ``TorchState`` and ``ElasticSampler``;
the loop and ``State``/``ObjectState`` are the shared ones (:mod:`hora._frontend.elastic`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hora._frontend.elastic import ObjectState, State, run_fn
from hora._frontend.surface import init, shutdown
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]

F = TypeVar("F", bound=Callable[..., Any])


def run(func: F) -> F:
    """Run ``func(state, *args, **kwargs)`` as elastic training: ranks may leave and join; on a failure the state
    goes back to its last ``commit()`` and training goes on with the ranks left. ``func`` must not be a collective
    itself (new ranks sync the state before calling it)."""
    return run_fn(func, _reset)


def _reset() -> None:
    shutdown()
    init()
