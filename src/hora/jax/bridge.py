"""Between JAX arrays and the numpy arrays the engine works on, eagerly and inside traced code.

A hora op is one Python call on numpy arrays (``fn(*arrays) -> list of arrays``). :func:`run_op` runs it:

- **eagerly** (no trace active, no tracer among the inputs): inputs are viewed with ``np.asarray`` (no copy for
  CPU arrays), the results are arrays the engine allocated for this call alone and become JAX arrays;
- **inside a trace** (``jax.jit``, ``jax.grad``, ``lax.scan``, ``lax.cond`` ...): the call is one ordered
  ``io_callback``. Ordered, because two ranks running their blocking collectives in different orders would wait
  for each other forever, and XLA is free to reorder (or run concurrently) callbacks that have no data dependence;
  an ordered callback also has an effect, so it is never dead-code-eliminated when its result is unused (a
  ``pure_callback`` would be, on some ranks' programs and not others', and the others would wait).

An eager call first waits for the callbacks of computations already dispatched (``jax.effects_barrier``): JAX
dispatches a jitted step asynchronously, and its collectives must keep their place before the next eager one.

Mapped traces (``vmap``, ``pmap``, ``shard_map``) would run one callback per mapped instance, each a separate
collective: they are refused with a ValueError naming the operation (at trace time, or through ``custom_vmap``
when an already-jitted function is vmapped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback

from hora.errors import UnsupportedError

__all__ = ["SUPPORTED", "aligned_empty", "check_dtype", "is_tracing", "run_op", "spec", "to_jax"]

_ALIGN = 64  # JAX adopts a numpy array's memory without a copy only when it is this aligned

SUPPORTED = tuple(
    np.dtype(d)
    for d in (jnp.uint8, jnp.int8, jnp.int16, jnp.int32, jnp.int64, jnp.float16, jnp.bfloat16, jnp.float32,
              jnp.float64, jnp.bool_)
)  # fmt: skip


def _trace_state_clean() -> bool:
    from jax._src import core  # no public query says whether a trace is active

    return bool(core.trace_state_clean())


def is_tracing(values: Sequence[Any]) -> bool:
    """True while JAX traces (a tracer among ``values``, or any trace active)."""
    return any(isinstance(v, jax.core.Tracer) for v in values) or not _trace_state_clean()


def check_dtype(dtype: Any, what: str) -> None:
    """UnsupportedError for a dtype hora does not carry (checked before anything is sent)."""
    if np.dtype(dtype) not in SUPPORTED:
        names = ", ".join(d.name for d in SUPPORTED)
        raise UnsupportedError(f"{what} does not support arrays of {np.dtype(dtype).name}; supported: {names}")


def spec(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), np.dtype(dtype))


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialised array whose data is 64-byte aligned, so that ``jax.device_put`` adopts it without a copy."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start : start + nbytes].view(dt).reshape(tuple(shape))


def to_jax(arr: np.ndarray, adopt: bool = False) -> jax.Array:
    """A JAX array of ``arr``'s values. With ``adopt`` (``arr`` was allocated by :func:`aligned_empty` for this
    result alone) a large one is adopted without a copy; otherwise it is copied: the engine recycles its own large
    buffers once nothing refers to them, so JAX must never alias one."""
    # (device_put, not jnp.asarray: that compiles a staging computation for every new shape)
    return jax.device_put(arr, may_alias=adopt)


def _mapped_axes() -> list[str]:
    """Names of the mapped axes of the traces active now (vmap, pmap, shard_map)."""
    from jax._src import core

    try:
        env = core.get_axis_env()
        return [str(n) for n in getattr(env, "axis_sizes", {})]
    except Exception:  # pragma: no cover - depends on JAX's internals; the tracer check below still applies
        return []


def _mapped_error(what: str, where: str = "") -> ValueError:
    return ValueError(
        f"hora.jax {what} cannot run inside jax.vmap, jax.pmap or shard_map{where}: the collective would run "
        "once per mapped instance, and the ranks would not agree on how many there are; call it outside the "
        "mapped function (one process per rank already gives the data parallelism)"
    )


def _refuse_mapped(inputs: Sequence[Any], what: str) -> None:
    from jax._src.interpreters import batching

    batched = any(isinstance(v, batching.BatchTracer) for v in inputs)
    axes = _mapped_axes()
    if batched or axes:
        raise _mapped_error(what, f" (mapped axes {axes})" if axes else "")


def run_op(
    fn: Callable[..., Sequence[np.ndarray]],
    inputs: Sequence[Any],
    out_specs: Sequence[jax.ShapeDtypeStruct],
    what: str,
    adopt: bool = False,
) -> list[jax.Array]:
    """Run the hora call ``fn`` on ``inputs`` (now, or as an ordered callback of the trace); results of
    ``out_specs``' shapes and dtypes (eagerly, the shapes ``fn`` returns). ``adopt``: ``fn`` returns arrays of
    :func:`aligned_empty` made for this call, which JAX may keep without a copy."""
    if not is_tracing(inputs):
        jax.effects_barrier()
        return [to_jax(np.asarray(o), adopt) for o in fn(*[np.asarray(x) for x in inputs])]
    _refuse_mapped(inputs, what)
    specs = list(out_specs)

    def host(*arrays: Any) -> list[np.ndarray]:
        outs = [np.asarray(o) for o in fn(*[np.asarray(a) for a in arrays])]
        for o, s in zip(outs, specs):
            if o.shape != s.shape or o.dtype != s.dtype:  # a bug, not user input: say so plainly
                raise RuntimeError(
                    f"hora.jax {what}: result {o.dtype}{list(o.shape)} != declared {s.dtype}{list(s.shape)}"
                )
        return outs

    # vmap of a function already traced (jax.vmap(jax.jit(f))) batches the callback after hora saw its inputs:
    # custom_vmap's rule refuses it with the same message.
    @custom_vmap
    def call(*args: Any) -> list[jax.Array]:
        return list(io_callback(host, specs, *args, ordered=True))

    @call.def_vmap
    def _batched(axis_size: int, in_batched: Any, *args: Any) -> Any:
        raise _mapped_error(what)

    return list(call(*inputs))
