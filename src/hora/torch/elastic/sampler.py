"""Horovod's ``ElasticSampler``: partitions a dataset over the ranks like ``DistributedSampler``, remembers how many
samples the job has processed this epoch, and after a reset partitions only the rest over the new ranks."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from hora._frontend.surface import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Put it in the :class:`TorchState`, call ``record_batch`` after each batch and ``set_epoch`` at the *end* of
    each epoch (it clears the processed samples). ``seed`` must be the same on every rank."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (its own shuffle) with no sample processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a batch of ``batch_size`` samples on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def reset(self) -> None:
        """Partition the epoch's unprocessed samples over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        indices += indices[: self.total_size - len(indices)]  # padded to a multiple of the ranks, as Horovod does
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
