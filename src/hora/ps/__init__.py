"""``hora.ps``: parameter servers — sharded variables on server processes, updated there by a rule given as data.

>>> import hora.numpy as hvd, hora.ps, numpy as np   # doctest: +SKIP
>>> hvd.init()                                        # under: hora run -np 2 --num-ps 2 python train.py
>>> ps = hora.ps.connect(consistency="bounded(2)")
>>> ps.register("w", np.zeros((1000, 64), np.float32), rule=hora.ps.Adam(lr=1e-3))
>>> w = ps.push_pull("w", grad)

See docs/ps.md.
"""

from hora.ps.client import Client, parse_consistency
from hora.ps.discovery import connect
from hora.ps.partition import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    ShardKey,
    balance,
    place,
    round_robin,
    shard_offsets,
)
from hora.ps.rules import RULES, SGD, Adagrad, Adam, Momentum, Sum, UpdateRule
from hora.ps.server import ParameterServer

__all__ = [
    "RULES",
    "SGD",
    "Adagrad",
    "Adam",
    "Client",
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Momentum",
    "ParameterServer",
    "Partitioner",
    "ShardKey",
    "Sum",
    "UpdateRule",
    "balance",
    "connect",
    "parse_consistency",
    "place",
    "round_robin",
    "shard_offsets",
]
