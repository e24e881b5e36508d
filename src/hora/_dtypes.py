"""The dtypes hora's collectives carry, the reduction operations (Horovod's numbering) and the elementwise
reductions every transport and the engine share."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "HALF",
    "ReduceOp",
    "combine",
    "even_counts",
    "offsets",
    "reduce_into",
    "scale_into",
    "ufunc",
]


class ReduceOp(enum.IntEnum):
    """Reduction operations, with Horovod's numbering."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in {
        "float16": np.float16,
        "bfloat16": ml_dtypes.bfloat16,
        "float32": np.float32,
        "float64": np.float64,
        "int8": np.int8,
        "int16": np.int16,
        "int32": np.int32,
        "int64": np.int64,
        "uint8": np.uint8,
        "bool": np.bool_,
    }.items()
}
HALF = (DTYPES["float16"], DTYPES["bfloat16"])
#: dtype -> its name in DTYPES (``np.dtype.name`` costs microseconds per call in numpy 2)
DTYPE_NAMES: dict[np.dtype, str] = {dt: name for name, dt in DTYPES.items()}

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def ufunc(op: int) -> np.ufunc:
    """The elementwise function of ``op`` (Sum, Min, Max, Product; Average sums)."""
    return _UFUNCS[ReduceOp(op)]


def reduce_into(acc: np.ndarray, x: np.ndarray, op: int) -> None:
    """``acc = acc (op) x`` elementwise, in place. For bool, Sum/Max are OR and Product/Min are AND."""
    _UFUNCS[ReduceOp(op)](acc, x, out=acc)


def combine(a: np.ndarray, b: np.ndarray, out: np.ndarray, op: int) -> None:
    """``out = a (op) b`` elementwise."""
    _UFUNCS[ReduceOp(op)](a, b, out=out)


def scale_into(src: np.ndarray, factor: float, out: np.ndarray) -> None:
    """``out = factor * src`` as Horovod's CPU ``ScaleBuffer`` computes it (horovod/common/ops/
    collective_operations.h): float64 keeps its type; float32 multiplies by ``(float) factor``; float16 (and
    bfloat16, which Horovod's CPU path treats the same way as far as we know) is widened to float32, multiplied
    by ``(float) factor`` and rounded back to nearest; integers (and bool) multiply in float64 and convert back by
    C truncation toward zero."""
    dt = src.dtype
    if dt == np.float64:
        np.multiply(src, factor, out=out)
    elif dt == np.float32:
        np.multiply(src, np.float32(factor), out=out)
    elif dt in HALF:
        out[...] = (src.astype(np.float32) * np.float32(factor)).astype(dt)
    else:
        np.multiply(src, np.float64(factor), out=out, casting="unsafe")  # float64 loop, truncating cast


def even_counts(n: int, parts: int) -> list[int]:
    """Split ``n`` items into ``parts`` counts as evenly as possible, the first ranks taking one more."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def offsets(counts: list[int]) -> list[int]:
    """Where each of ``counts`` starts when they are laid end to end."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out
