"""``Compression`` for hora.keras: TensorFlow's compressors on the TensorFlow backend (fp16 halves the bytes
sent); ``Compression.none`` everywhere."""

from __future__ import annotations

from typing import Any

from hora._frontend.compression import NoneCompressor

__all__ = ["Compression"]


class _FP16Compressor:
    """Floating tensors travel as float16 (TensorFlow backend)."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        from hora.tensorflow.compression import FP16Compressor

        return FP16Compressor.compress(tensor)

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        from hora.tensorflow.compression import FP16Compressor

        return FP16Compressor.decompress(tensor, ctx)


class Compression:
    none = NoneCompressor
    fp16 = _FP16Compressor
