"""Horovod's compressor interface and ``Compression.none``, the same for every framework; each adapter adds its
own ``FP16Compressor`` (a cast in the framework's terms) and its ``Compression`` namespace."""

from __future__ import annotations

from typing import Any

__all__ = ["Compressor", "NoneCompressor"]


class Compressor:
    """Interface: ``compress`` a tensor before it is communicated, ``decompress`` the result after."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Returns the tensor to communicate and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Communicate the tensor as it is."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor
