"""Data for training scripts: the records of a ``hora job`` Pipe-mode channel (:class:`PipeDataset`,
:mod:`.pipe_mode`), TFRecord framing (:mod:`.tfrecord`) and RecordIO framing (:mod:`.recordio`)."""

from hora.data.pipe_mode import RECORD_FORMATS, PipeDataset
from hora.data.recordio import encode_recordio, iter_recordio
from hora.data.tfrecord import encode_tfrecord, iter_tfrecords

__all__ = ["RECORD_FORMATS", "PipeDataset", "encode_recordio", "encode_tfrecord", "iter_recordio", "iter_tfrecords"]
