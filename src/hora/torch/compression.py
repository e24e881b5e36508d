"""Gradient compression for allreduce, with Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface: ``compress`` a tensor before it is communicated, ``decompress`` the result after."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Returns the tensor to communicate and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Communicate the tensor as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


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
