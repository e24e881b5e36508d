"""Data for training scripts: the records of a ``hora job`` Pipe-mode channel (:class:`PipeDataset`,
:mod:`.pipe_mode`) and TFRecord framing (:mod:`.tfrecord`)."""

from hora.data.pipe_mode import RECORD_FORMATS, PipeDataset
from hora.data.tfrecord import encode_tfrecord, iter_tfrecords

__all__ = ["RECORD_FORMATS", "PipeDataset", "encode_tfrecord", "iter_tfrecords"]
