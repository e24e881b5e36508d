"""Between TensorFlow tensors and the numpy arrays the engine works on, in every execution mode.

A hora op is one Python call on numpy arrays (``fn(*arrays) -> list of arrays``). :func:`run_op` runs it:

- **eagerly**: inputs are viewed with ``np.asarray`` (no copy; ``EagerTensor.numpy()`` would copy), the results
  are arrays this module allocated (64-byte aligned) and become tensors through DLPack without a copy;
- **in a graph** (``tf.function`` or a ``tf.compat.v1`` graph): the call is a ``tf.numpy_function(stateful=True)``,
  which also passes its inputs and aligned outputs without copies. In a v1 graph, hora ops are chained with control
  dependencies, because a Session runs independent Python ops concurrently and in any order, and two ranks running
  their blocking collectives in different orders would wait for each other forever (``tf.function`` already orders
  stateful ops as written).

Errors: a mismatch across ranks (:class:`hora.errors.MismatchError`) is a ``tf.errors.FailedPreconditionError`` in
every mode, as Horovod's is. A Python exception inside a ``numpy_function`` always reaches the user as
``UnknownError``, so in graphs the op returns a status and a message, and a native op that fails with
FAILED_PRECONDITION (writing to a path below ``/dev/null``: ENOTDIR) carries the message out; on success the same
op writes nothing to ``/dev/null``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from hora.errors import MismatchError, UnsupportedError

__all__ = ["SUPPORTED", "aligned_empty", "check_dtype", "executing_eagerly", "run_op", "to_array"]

SUPPORTED = (
    tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool,
)  # fmt: skip
_ALIGN = 64  # TensorFlow adopts a numpy array's memory without a copy only when it is this aligned
_DLPACK_MIN = 1 << 16  # below this a copy is cheaper than DLPack's fixed cost (~35 µs)
_OK_PATH = b"/dev/null"
_FAIL_PREFIX = "/dev/null/\n"  # the message then starts on a line of its own


def executing_eagerly() -> bool:
    """True when ops run eagerly (not while a ``tf.function`` or a v1 graph is being built)."""
    return bool(tf.executing_eagerly())


def check_dtype(dtype: tf.DType, what: str) -> None:
    """ValueError (at graph-build time) for a dtype hora does not carry."""
    if tf.as_dtype(dtype).base_dtype not in SUPPORTED:
        names = ", ".join(d.name for d in SUPPORTED)
        raise UnsupportedError(f"{what} does not support tensors of {tf.as_dtype(dtype).name}; supported: {names}")


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialised array whose data is 64-byte aligned (so TensorFlow can adopt it without a copy)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start : start + nbytes].view(dt).reshape(tuple(shape))


def to_array(t: Any) -> np.ndarray:
    """The numpy view of an eager tensor (no copy) or of anything array-like."""
    if getattr(t, "dtype", None) == tf.bfloat16:  # np.asarray refuses bfloat16 tensors: view them as int16
        return np.asarray(tf.bitcast(t, tf.int16)).view(ml_dtypes.bfloat16)
    return np.asarray(t)


def _eager_tensor(arr: np.ndarray) -> tf.Tensor:
    if arr.nbytes >= _DLPACK_MIN and arr.dtype != ml_dtypes.bfloat16 and arr.ctypes.data % _ALIGN == 0:
        return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
    return tf.constant(arr)


def failed_precondition(message: str) -> tf.errors.FailedPreconditionError:
    return tf.errors.FailedPreconditionError(None, None, message)


# The last hora op of each v1 graph, so that the next one runs after it.
_last_op: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _check_not_xla(what: str) -> None:
    # tf.function(jit_compile=True) traces inside an XLA control-flow context; TensorFlow has no public query.
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"{what} cannot run inside tf.function(jit_compile=True): hora ops are host callbacks, which XLA cannot "
            "compile; drop jit_compile=True (Keras: compile(jit_compile=False))"
        )


def run_op(
    fn: Callable[..., Sequence[np.ndarray]],
    inputs: Sequence[tf.Tensor],
    touts: Sequence[tf.DType],
    what: str,
    shapes: Sequence[Any] | None = None,
) -> list[tf.Tensor]:
    """Run the hora call ``fn`` on ``inputs`` (eagerly or as a graph op); returns tensors of dtypes ``touts``."""
    if executing_eagerly():
        try:
            outs = fn(*[to_array(t) for t in inputs])
        except MismatchError as exc:
            raise failed_precondition(str(exc)) from None
        return [_eager_tensor(np.asarray(o)) for o in outs]
    _check_not_xla(what)
    np_touts = [tf.as_dtype(t).as_numpy_dtype for t in touts]

    def graph_fn(*arrays: np.ndarray) -> list[Any]:
        try:
            outs = list(fn(*arrays))
        except MismatchError as exc:
            return [np.zeros(0, d) for d in np_touts] + [(_FAIL_PREFIX + str(exc)).encode()]
        return [*outs, _OK_PATH]

    graph = tf.compat.v1.get_default_graph()
    chain = [] if getattr(graph, "building_function", False) else [op for op in [_last_op.get(graph)] if op]
    with tf.control_dependencies(chain):
        res = tf.numpy_function(graph_fn, list(inputs), [*touts, tf.string], stateful=True, name=what)
    if not getattr(graph, "building_function", False):
        _last_op[graph] = res[-1].op
    # Writes nothing to /dev/null when the collective succeeded; fails with the message otherwise. WriteFile
    # because it is stateful: a control dependency on a stateless ReadFile is pruned by Grappler in a tf.function.
    # (No tf.cond: it costs far more to build and to run.)
    check = tf.io.write_file(res[-1], "")
    outs = []
    with tf.control_dependencies([check]):
        for i, o in enumerate(res[:-1]):
            o = tf.identity(o)
            if shapes is not None and shapes[i] is not None:
                o.set_shape(shapes[i])
            outs.append(o)
    return outs
