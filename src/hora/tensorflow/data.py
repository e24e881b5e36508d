"""Input data for TensorFlow scripts: ``PipeModeDataset`` over a ``hora job`` Pipe-mode channel (the call shape of
SageMaker's ``sagemaker_tensorflow.PipeModeDataset``) and sharding a ``tf.data`` pipeline by rank or by host."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._frontend import cross_rank, cross_size, local_rank, local_size, rank, size
from hora.data import PipeDataset

__all__ = ["PipeModeDataset", "shard"]


def PipeModeDataset(
    channel: str,
    record_format: str = "TFRecord",
    state_dir: Any = None,
    pipe_dir: Any = None,
    benchmark: bool = False,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the records of Pipe-mode ``channel``, one epoch's FIFO per iteration of the
    dataset (repeat it for more epochs: each iteration opens the next FIFO). ``record_format``: ``"TFRecord"``
    (each record's bytes), ``"RecordIO"`` (each record's bytes, MXNet's framing, as SageMaker's) or ``"TextLine"``
    (each line's bytes). ``state_dir``, ``pipe_dir`` and ``benchmark`` are accepted for the call shape and
    ignored: the channel is found through the ``hora job`` environment (or ``channel`` is a path)."""
    formats = {"tfrecord": "tfrecord", "recordio": "recordio", "textline": "text", "text": "text"}
    fmt = formats.get(record_format.lower())
    if fmt is None:
        raise NotImplementedError(
            f"PipeModeDataset record_format={record_format!r} is not supported by hora; "
            "use 'TFRecord', 'RecordIO' or 'TextLine'"
        )
    source = PipeDataset(channel, record_format=fmt, encoding=None)

    def records() -> Any:
        for rec in source:
            yield rec.encode() if isinstance(rec, str) else rec

    return tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec([], tf.string))


def shard(dataset: tf.data.Dataset, by: str = "rank") -> tf.data.Dataset:
    """``dataset.shard`` so each rank (``by="rank"``), each local rank of a host over the host's data
    (``by="local_rank"``) or each host (``by="host"``) reads its own part."""
    if by == "rank":
        return dataset.shard(size(), rank())
    if by == "local_rank":
        return dataset.shard(local_size(), local_rank())
    if by == "host":
        return dataset.shard(cross_size(), cross_rank())
    raise ValueError(f"shard(by={by!r}): by must be 'rank', 'local_rank' or 'host'")
