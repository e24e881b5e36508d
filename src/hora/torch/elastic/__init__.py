"""``hora.torch.elastic`` (Horovod's ``horovod.torch.elastic``): ``run``, ``TorchState`` and ``ElasticSampler``;
the loop, ``State`` and ``ObjectState`` are the shared ones (:mod:`hora._frontend.elastic`)."""

from __future__ import annotations

from hora._frontend.elastic import ObjectState, State, run
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]
