"""Gradient compression for allreduce, with Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from hora._frontend.compression import Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class FP16Compressor(Compressor):
    """Communicate floating-point arrays as float16 (half the bytes); other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if jnp.issubdtype(dtype, jnp.floating) and dtype != jnp.float16:
            tensor = tensor.astype(jnp.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        if jnp.issubdtype(ctx, jnp.floating) and tensor.dtype != ctx:
            tensor = tensor.astype(ctx)
        return tensor


class Compression:
    """The compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
