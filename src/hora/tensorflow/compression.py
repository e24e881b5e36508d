"""Gradient compression for allreduce, with Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora._frontend.compression import Compressor, NoneCompressor


class FP16Compressor(Compressor):
    """Communicate floating-point tensors as float16 (half the bytes); other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            tensor = tf.cast(tensor, tf.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        if ctx.is_floating and tensor.dtype != ctx:
            tensor = tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
