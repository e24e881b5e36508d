"""Partitioners equal to TensorFlow's (called directly), ParameterServerStrategy's row split, and byte-balanced
placement of a 1M x 64 embedding plus dense layers over 2 and 3 servers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hora.ps.partition import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    ShardKey,
    balance,
    place,
    round_robin,
    shard_offsets,
)

tf = pytest.importorskip("tensorflow")
P = tf.distribute.experimental.partitioners

SHAPES = [(1,), (6, 1), (10, 3), (7, 5, 2), (1000, 64), (1_000_000, 64), (3, 1000), (513, 17)]
DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int8]


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7, 1000])
def test_fixed_shards_equals_tensorflow(num_shards):
    for shape, dtype in itertools.product(SHAPES, DTYPES):
        ours = FixedShardsPartitioner(num_shards)(shape, dtype)
        theirs = P.FixedShardsPartitioner(num_shards)(tf.TensorShape(shape), tf.as_dtype(dtype))
        assert ours == list(theirs), (shape, dtype)


@pytest.mark.parametrize(("min_bytes", "max_shards"), [(4, 2), (4, 10), (256 << 10, 1), (256 << 10, 8), (1 << 20, 3), (100, 1000), (7, 5)])
def test_min_size_equals_tensorflow(min_bytes, max_shards):
    for shape, dtype in itertools.product(SHAPES, DTYPES):
        ours = MinSizePartitioner(min_bytes, max_shards)(shape, dtype)
        theirs = P.MinSizePartitioner(min_shard_bytes=min_bytes, max_shards=max_shards)(tf.TensorShape(shape), tf.as_dtype(dtype))
        assert ours == list(theirs), (shape, dtype)


@pytest.mark.parametrize(("max_bytes", "max_shards"), [(4, None), (4, 2), (1024, None), (1 << 20, None), (1 << 20, 3), (3, None), (100_000, 7)])
def test_max_size_equals_tensorflow(max_bytes, max_shards):
    for shape, dtype in itertools.product(SHAPES, DTYPES):
        ours = MaxSizePartitioner(max_bytes, max_shards)(shape, dtype)
        theirs = P.MaxSizePartitioner(max_shard_bytes=max_bytes, max_shards=max_shards)(tf.TensorShape(shape), tf.as_dtype(dtype))
        assert ours == list(theirs), (shape, dtype)


def test_tensorflow_argument_errors_are_the_same():
    for make in (lambda: MinSizePartitioner(0), lambda: MinSizePartitioner(4, 0), lambda: MaxSizePartitioner(0)):
        with pytest.raises(ValueError, match="must be positive"):
            make()


def test_row_split_is_parameter_server_strategys():
    assert shard_offsets(10, 4) == [0, 3, 6, 8, 10]  # TF's own example in parameter_server_strategy_v2.py
    assert shard_offsets(6, 2) == [0, 3, 6]
    assert shard_offsets(2, 5) == [0, 1, 2]
    for rows, n in itertools.product(range(1, 40), range(1, 9)):
        offsets = shard_offsets(rows, n)
        sizes = np.diff(offsets)
        assert offsets[0] == 0 and offsets[-1] == rows and len(sizes) == min(n, rows)
        assert sizes.max() - sizes.min() <= 1 and list(sizes) == sorted(sizes, reverse=True)


def _model_shards(num_servers: int, partitioner) -> list[ShardKey]:
    """A 1M x 64 float32 embedding and the dense layers of a small tower, partitioned by ``partitioner``."""
    variables = {"embedding": (1_000_000, 64), "dense1/kernel": (64, 512), "dense1/bias": (512,),
                 "dense2/kernel": (512, 256), "dense2/bias": (256,), "out/kernel": (256, 1), "out/bias": (1,)}
    keys = []
    for name, shape in variables.items():
        offsets = shard_offsets(shape[0], partitioner(shape, np.float32)[0])
        row = int(np.prod(shape[1:])) * 4
        keys += [ShardKey(name, i, (offsets[i + 1] - offsets[i]) * row) for i in range(len(offsets) - 1)]
    return keys


@pytest.mark.parametrize("servers", [2, 3])
def test_embedding_and_dense_layers_balance_within_five_percent(servers):
    keys = _model_shards(servers, FixedShardsPartitioner(servers))
    ours = balance(place(keys, servers), servers)
    assert ours["max_over_mean"] <= 1.05, ours
    assert sum(ours["bytes"]) == sum(k.nbytes for k in keys)
    # TensorFlow's round-robin placement of the same shards: the dense layers pile on whoever comes next
    theirs = balance(round_robin(keys, servers), servers)
    assert ours["max_over_mean"] <= theirs["max_over_mean"]


def test_unpartitioned_embedding_shows_why_partitioning_matters():
    keys = _model_shards(2, FixedShardsPartitioner(1))
    assert balance(place(keys, 2), 2)["max_over_mean"] > 1.9  # one server holds nearly everything


def test_placement_is_deterministic_and_order_free():
    keys = _model_shards(3, MinSizePartitioner(1 << 20, 3))
    assert place(keys, 3) == place(list(reversed(keys)), 3)
