"""Gradient compression for allreduce, with Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import torch

from hora._frontend.compression import Compressor, NoneCompressor


class FP16Compressor(Compressor):
    """Communicate floating-point tensors as float16 (half the bytes); other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            tensor = tensor.type(torch.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        dtype = ctx
        if dtype.is_floating_point and tensor.dtype != dtype:
            tensor = tensor.type(dtype)
        return tensor


class Compression:
    """The compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
