"""Server-side update rules, configured as data (a JSON object), never as code.

A rule is ``{"rule": NAME, ...hyperparameters}``: it crosses the wire as JSON inside an authenticated frame and is
checked here (known name, known keys, finite numbers) before a server keeps it. Each rule updates a shard in place
from a gradient, dense (the whole shard) or sparse (some rows, and only those rows' optimizer slots):

- ``sum``: ``p += g`` (a BytePS-style summation server).
- ``sgd``: ``p -= lr * g``.
- ``momentum``: PyTorch's form, ``buf = momentum * buf + g``; ``p -= lr * buf`` (``nesterov``: ``p -= lr * (g +
  momentum * buf)``). Keras' velocity form is the same update for a constant learning rate.
- ``adagrad``: ``acc += g * g``; ``p -= lr * g / (sqrt(acc) + epsilon)``, ``acc`` starting at
  ``initial_accumulator`` (PyTorch: 0, epsilon 1e-10; Keras: 0.1, epsilon 1e-7).
- ``adam``: PyTorch's form with bias correction, ``t`` counted per shard (sparse pushes count too: a "lazy" Adam
  whose untouched rows keep their moments, as TensorFlow's LazyAdam).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from hora.errors import ConfigError

__all__ = ["RULES", "Deliver", "Fetch", "Rule", "apply_dense", "apply_rows", "apply_streamed", "check_rule", "new_slots"]

Rule = dict[str, Any]

#: rule name -> its hyperparameters and their defaults (PyTorch's).
RULES: dict[str, dict[str, float | bool]] = {
    "sum": {},
    "sgd": {"lr": 0.01},
    "momentum": {"lr": 0.01, "momentum": 0.9, "nesterov": False},
    "adagrad": {"lr": 0.01, "initial_accumulator": 0.0, "epsilon": 1e-10},
    "adam": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
}
_SLOTS = {"sum": (), "sgd": (), "momentum": ("buf",), "adagrad": ("acc",), "adam": ("m", "v")}


def check_rule(rule: Any, what: str = "the update rule") -> Rule:
    """``rule`` validated and completed with its defaults; ``ConfigError`` naming the problem otherwise.

    Accepts a name (``"sgd"``) or a mapping (``{"rule": "adam", "lr": 1e-3}``).
    """
    if isinstance(rule, str):
        rule = {"rule": rule}
    if not isinstance(rule, dict) or not isinstance(rule.get("rule"), str):
        raise ConfigError(f"{what} must be a rule name or a dict with a 'rule' key, one of {sorted(RULES)}; got {rule!r}")
    name = rule["rule"].lower()
    if name not in RULES:
        raise ConfigError(f"{what}: unknown rule {rule['rule']!r}; the rules are {', '.join(sorted(RULES))}")
    params = RULES[name]
    unknown = sorted(set(rule) - set(params) - {"rule"})
    if unknown:
        raise ConfigError(f"{what}: rule {name!r} has no parameter {', '.join(unknown)}; it takes {sorted(params) or 'none'}")
    out: Rule = {"rule": name}
    for key, default in params.items():
        value = rule.get(key, default)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{what}: {name}.{key} must be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{what}: {name}.{key} must be a finite number, got {value!r}")
        elif value < 0:
            raise ConfigError(f"{what}: {name}.{key} must be >= 0, got {value!r}")
        out[key] = value if isinstance(default, bool) else float(value)
    return out


def new_slots(rule: Rule, shape: tuple[int, ...], dtype: np.dtype[Any]) -> dict[str, np.ndarray]:
    """The optimizer slots a shard keeps for ``rule`` (zeros, Adagrad's accumulator at its initial value)."""
    slots = {name: np.full(shape, 0, dtype) for name in _SLOTS[rule["rule"]]}  # written now: no page faults later
    if rule["rule"] == "adagrad" and rule["initial_accumulator"]:
        slots["acc"].fill(rule["initial_accumulator"])
    return slots


#: Elements updated at a time: the rule's temporaries and the copy to ``out`` stay in the cache, and no temporary
#: as large as the shard is ever allocated (elementwise, so chunking changes no bit of the result).
CHUNK = 1 << 17


def apply_dense(
    rule: Rule, param: np.ndarray, grad: np.ndarray, slots: dict[str, np.ndarray], t: int, out: np.ndarray | None = None
) -> None:
    """Update ``param`` in place from ``grad``; ``t`` is the 1-based count of updates of this shard (Adam).

    With ``out`` (same shape, C-contiguous), also copy the updated values there, chunk by chunk right after each is
    updated; ``out`` may be ``grad`` itself (each chunk of the gradient is used before it is overwritten).
    """
    if param.size <= CHUNK or not (param.flags.c_contiguous and all(v.flags.c_contiguous for v in slots.values())):
        _apply(rule, param, grad, slots, t)  # small (nothing to chunk), or reshaping would copy: update in place
        if out is not None:
            np.copyto(out, param)
        return
    g = np.ascontiguousarray(grad).reshape(-1)
    o = out.reshape(-1) if out is not None else None
    deliver = None if o is None else (lambda lo, values: np.copyto(o[lo : lo + values.size], values))
    _chunked(rule, param, slots, t, lambda lo, hi: g[lo:hi], deliver)


def _chunked(
    rule: Rule, param: np.ndarray, slots: dict[str, np.ndarray], t: int,
    chunk: Callable[[int, int], np.ndarray], deliver: Deliver | None,
) -> None:  # fmt: skip
    """Update contiguous ``param`` :data:`CHUNK` elements at a time from ``chunk(lo, hi)`` (the gradient's elements
    lo..hi), handing each updated chunk to ``deliver`` while it is in the cache."""
    p = param.reshape(-1)
    flat = {k: v.reshape(-1) for k, v in slots.items()}
    for lo in range(0, p.size, CHUNK):
        hi = min(lo + CHUNK, p.size)
        _apply(rule, p[lo:hi], chunk(lo, hi), {k: v[lo:hi] for k, v in flat.items()}, t)
        if deliver is not None:
            deliver(lo, p[lo:hi])


#: ``fetch(offset, buf)``: fill ``buf`` with the gradient's elements from ``offset`` on; ``deliver(offset, values)``:
#: hand on updated values that start at element ``offset`` (:func:`apply_streamed`).
Fetch = Callable[[int, np.ndarray], None]
Deliver = Callable[[int, np.ndarray], None]


def apply_streamed(
    rule: Rule, param: np.ndarray, slots: dict[str, np.ndarray], t: int, fetch: Fetch, deliver: Deliver | None
) -> None:
    """:func:`apply_dense` with a gradient that is not in this process: each chunk is fetched into a scratch buffer
    in the cache, updated, and its new values delivered at once (a worker's memory, :mod:`hora.ps.cma`). A fetch
    that fails leaves the chunks before it updated."""
    if param.size <= CHUNK or not (param.flags.c_contiguous and all(v.flags.c_contiguous for v in slots.values())):
        grad = np.empty(param.shape, param.dtype)
        fetch(0, grad.reshape(-1))
        _apply(rule, param, grad, slots, t)
        if deliver is not None:
            deliver(0, np.ascontiguousarray(param).reshape(-1))
        return
    buf = _scratch(param.dtype, (CHUNK,), CHUNK, 2, 1)[0]  # the pool's rows 0-1 are _apply's temporaries

    def chunk(lo: int, hi: int) -> np.ndarray:
        fetch(lo, buf[: hi - lo])
        return buf[: hi - lo]

    _chunked(rule, param, slots, t, chunk, deliver)


def apply_rows(
    rule: Rule, param: np.ndarray, rows: np.ndarray, grad: np.ndarray, slots: dict[str, np.ndarray], t: int
) -> None:
    """Update the rows ``rows`` (unique, in range) of ``param`` from ``grad`` (one row each); only those rows of
    the slots change."""
    row = param.size // max(len(param), 1)
    bufs = _scratch(param.dtype, (len(rows), *param.shape[1:]), len(rows) * row, 2, 1 + len(slots))
    p = np.take(param, rows, axis=0, out=bufs[0], mode="clip")  # rows are checked; "raise" would buffer
    s = {k: np.take(v, rows, axis=0, out=b, mode="clip") for (k, v), b in zip(slots.items(), bufs[1:])}
    _apply(rule, p, grad, s, t)
    param[rows] = p
    for k, v in s.items():
        slots[k][rows] = v


_local = threading.local()
_TEMP_LIMIT = 1 << 22  # elements: larger updates (unchunked) allocate their temporaries instead of keeping them
_SMALL = 1 << 12  # elements
_POOL = 5  # two temporaries, then a sparse update's gathered rows and at most two slots


def _scratch(dtype: np.dtype[Any], shape: tuple[int, ...], size: int, first: int, count: int) -> list[np.ndarray]:
    """``count`` scratch arrays of ``shape`` (``size`` elements), rows ``first..`` of this thread's pool: the rules
    allocate nothing per update (a fresh megabyte costs its page faults, ~0.6 ms here, every time)."""
    if size > _TEMP_LIMIT:
        return [np.empty(shape, dtype) for _ in range(count)]
    try:
        pool = _local.pool
    except AttributeError:
        pool = _local.pool = {}
    buf = pool.get(dtype)
    if buf is None or buf.shape[1] < size:
        buf = pool[dtype] = np.empty((_POOL, max(size, CHUNK)), dtype)
    return [buf[i, :size].reshape(shape) for i in range(first, first + count)]


def _temps(like: np.ndarray) -> list[np.ndarray]:
    if like.size <= _SMALL:  # a small block from malloc's free lists costs less than slicing the pool
        return [np.empty_like(like), np.empty_like(like)]
    return _scratch(like.dtype, like.shape, like.size, 0, 2)


def _apply(rule: Rule, p: np.ndarray, g: np.ndarray, slots: dict[str, np.ndarray], t: int) -> None:
    """One update, written as the textbook expression but with every temporary in scratch (``out=``): the same
    operations in the same order, so the same bits as ``p -= lr * g / (sqrt(acc) + eps)`` and friends."""
    name = rule["rule"]
    dt = p.dtype.type
    if name == "sum":
        np.add(p, g, out=p)
        return
    t0, t1 = _temps(p)
    if name == "sgd":
        np.subtract(p, np.multiply(g, dt(rule["lr"]), out=t0), out=p)
    elif name == "momentum":
        buf = slots["buf"]
        buf *= dt(rule["momentum"])
        buf += g
        if rule["nesterov"]:
            np.add(g, np.multiply(buf, dt(rule["momentum"]), out=t0), out=t0)
            np.subtract(p, np.multiply(t0, dt(rule["lr"]), out=t0), out=p)
        else:
            np.subtract(p, np.multiply(buf, dt(rule["lr"]), out=t0), out=p)
    elif name == "adagrad":
        acc = slots["acc"]
        acc += np.multiply(g, g, out=t0)
        np.multiply(g, dt(rule["lr"]), out=t0)
        np.add(np.sqrt(acc, out=t1), dt(rule["epsilon"]), out=t1)
        np.subtract(p, np.divide(t0, t1, out=t0), out=p)
    elif name == "adam":
        m, v = slots["m"], slots["v"]
        b1, b2 = dt(rule["beta1"]), dt(rule["beta2"])
        m *= b1
        m += np.multiply(g, dt(1) - b1, out=t0)
        v *= b2
        v += np.multiply(np.multiply(g, g, out=t0), dt(1) - b2, out=t0)
        bc1 = 1.0 - rule["beta1"] ** t
        bc2 = 1.0 - rule["beta2"] ** t
        step = dt(rule["lr"] / bc1)
        np.add(np.divide(np.sqrt(v, out=t1), dt(math.sqrt(bc2)), out=t1), dt(rule["epsilon"]), out=t1)
        np.subtract(p, np.divide(np.multiply(m, step, out=t0), t1, out=t0), out=p)
    else:  # check_rule keeps anything else out
        raise ConfigError(f"unknown rule {name!r}")
