"""Gradient compression for allreduce, with Horovod's names: ``Compression.none`` and ``Compression.fp16``
(``horovod/mxnet/compression.py``)."""

from __future__ import annotations

from typing import Any

from hora._frontend.compression import Compressor, NoneCompressor


class FP16Compressor(Compressor):
    """Communicate floating-point NDArrays as float16 (half the bytes); other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        compressed = tensor
        if "float" in str(tensor.dtype):
            compressed = tensor.astype("float16", copy=False)
        return compressed, tensor.dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        if "float" in str(ctx):
            return tensor.astype(ctx, copy=False)
        return tensor


class Compression:
    """The compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
