"""Splitting variables into shards along axis 0 (TensorFlow's partitioners, to the formula) and placing shards on
servers so that every server holds about the same bytes.

The partitioners return, like ``tf.distribute.experimental.partitioners``, a list with the number of shards on
each axis (only axis 0 is ever split); :func:`shard_offsets` splits the rows as ``ParameterServerStrategy`` does
(the first ``rows % n`` shards get one row more). TensorFlow places shards round-robin, in creation order, whatever
their size; :func:`place` puts the largest shard first on the least-loaded server instead (ties: the lower server),
and :func:`round_robin` is TensorFlow's placement, for comparison (:func:`balance`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hora.errors import ConfigError

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Partitioner",
    "ShardKey",
    "balance",
    "place",
    "round_robin",
    "shard_offsets",
]


def _element_size(dtype: Any, bytes_per_string: int) -> int:
    dt = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))
    return bytes_per_string if dt.kind in "SUO" else dt.itemsize


def _shape(shape: Any) -> tuple[int, ...]:
    dims = getattr(shape, "as_list", None)
    out = tuple(int(d) for d in (dims() if dims else shape))
    if not out:
        raise ConfigError("a scalar variable cannot be partitioned: give it a shape with at least one axis")
    return out


class Partitioner:
    """Base class: ``partitioner(shape, dtype, axis=0)`` -> shards per axis (TensorFlow's contract)."""

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """``num_shards`` shards, or one per row when there are fewer rows (TensorFlow's ``FixedShardsPartitioner``)."""

    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        result = [1] * len(dims)
        result[axis] = min(self._num_shards, dims[axis])
        return result


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least ``min_shard_bytes``, at most ``max_shards`` (TensorFlow's
    ``MinSizePartitioner``: ``max(1, min(rows, max_shards, ceil(total_bytes / min_shard_bytes)))``)."""

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ) -> None:
        if min_shard_bytes < 1:
            raise ValueError(f"Argument `min_shard_bytes` must be positive. Received: {min_shard_bytes}")
        if max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received: {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"Argument `bytes_per_string` must be positive. Received: {bytes_per_string}")
        self._min_shard_bytes = min_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        if axis >= len(dims):
            raise ValueError(f"Cannot partition variable along axis {axis} when shape is only {list(dims)}")
        total = math.prod(dims) * _element_size(dtype, self._bytes_per_string)
        result = [1] * len(dims)
        result[axis] = max(1, min(dims[axis], self._max_shards, math.ceil(total / self._min_shard_bytes)))
        return result


class MaxSizePartitioner(Partitioner):
    """As few shards as keep each at most ``max_shard_bytes`` (whole rows; a row larger than that is a shard of its
    own), capped by ``max_shards`` (TensorFlow's ``MaxSizePartitioner``)."""

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ) -> None:
        if max_shard_bytes < 1:
            raise ValueError(f"Argument `max_shard_bytes` must be positive. Received {max_shard_bytes}")
        if max_shards and max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"Argument `bytes_per_string` must be positive. Received: {bytes_per_string}")
        self._max_shard_bytes = max_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        size = _element_size(dtype, self._bytes_per_string)
        bytes_per_slice = 1.0 * (math.prod(dims) / dims[axis]) * size
        slices_per_shard = max(1, math.floor(self._max_shard_bytes / bytes_per_slice))
        axis_shards = math.ceil(1.0 * dims[axis] / slices_per_shard)
        if self._max_shards:
            axis_shards = min(self._max_shards, axis_shards)
        result = [1] * len(dims)
        result[axis] = axis_shards
        return result


def shard_offsets(rows: int, num_shards: int) -> list[int]:
    """Row offsets of ``num_shards`` shards of ``rows`` rows, ``ParameterServerStrategy``'s split: 10 rows in 4
    shards -> ``[0, 3, 6, 8, 10]``."""
    n = max(1, min(num_shards, rows)) if rows else 1
    base, extra = divmod(rows, n)
    offsets = [0]
    for i in range(n):
        offsets.append(offsets[-1] + base + (1 if i < extra else 0))
    return offsets


@dataclass(frozen=True)
class ShardKey:
    """One shard: variable ``name``, shard ``index``, and its size in bytes."""

    name: str
    index: int
    nbytes: int


def place(
    shards: Sequence[ShardKey], num_servers: int, loads: Sequence[int] | None = None
) -> dict[ShardKey, int]:
    """Byte-balanced placement: largest shard first (ties by name, then index) onto the server holding the fewest
    bytes so far (ties: the lowest index). ``loads``: bytes the servers already hold. Deterministic, so every worker
    that registers the same variables computes the same placement."""
    load = list(loads) if loads is not None else [0] * num_servers
    out: dict[ShardKey, int] = {}
    for key in sorted(shards, key=lambda k: (-k.nbytes, k.name, k.index)):
        server = min(range(num_servers), key=lambda s: (load[s], s))
        out[key] = server
        load[server] += key.nbytes
    return out


def round_robin(shards: Sequence[ShardKey], num_servers: int, start: int = 0) -> dict[ShardKey, int]:
    """TensorFlow's placement: shard i of the creation order on server ``(start + i) % num_servers``."""
    return {key: (start + i) % num_servers for i, key in enumerate(shards)}


def balance(placement: dict[ShardKey, int], num_servers: int) -> dict[str, Any]:
    """Bytes per server and max/mean (1.0 is perfect balance)."""
    per = [0] * num_servers
    for key, server in placement.items():
        per[server] += key.nbytes
    mean = sum(per) / num_servers if num_servers else 0.0
    return {
        "bytes": per,
        "max": max(per, default=0),
        "mean": mean,
        "max_over_mean": max(per) / mean if mean else 1.0,
    }
