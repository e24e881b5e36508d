"""The framework-independent elastic API (Horovod's ``horovod.common.elastic``), ``hvd.elastic`` in ``hora.numpy``,
``hora.jax`` and ``hora.mxnet``: ``run``, ``State`` and ``ObjectState(bcast_object, get_rank, **kwargs)``.
``hora.torch.elastic`` adds ``TorchState`` and ``ElasticSampler``. See docs/elastic.md."""

from __future__ import annotations

from hora._frontend.elastic import ObjectState, State, run

__all__ = ["ObjectState", "State", "run"]
