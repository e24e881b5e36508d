"""Gradient compression for allreduce, with Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface: ``compress`` an array before it is communicated, ``decompress`` the result after."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Returns the array to communicate and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Communicate the array as it is."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


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
