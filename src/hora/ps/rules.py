"""Server-side update rules, configured as data, never as code.

A rule is a frozen dataclass (:class:`Sum`, :class:`SGD`, :class:`Momentum`, :class:`Adagrad`, :class:`Adam`),
checked once, when it is built (known parameters, finite numbers >= 0, booleans where booleans belong). It crosses
the wire as its JSON form ``{"rule": NAME, ...hyperparameters}`` (:meth:`UpdateRule.to_json`), and
:func:`parse_rule` turns that form or a name into a rule, naming what is wrong otherwise; a server parses what it
receives before it keeps it. Each rule updates a shard in place from a gradient, dense (the whole shard) or sparse
(some rows, and only those rows' optimizer slots):

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

import dataclasses
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hora.errors import ConfigError

__all__ = [
    "RULES",
    "SGD",
    "Adagrad",
    "Adam",
    "Deliver",
    "Fetch",
    "Momentum",
    "Slots",
    "Sum",
    "UpdateRule",
    "apply_dense",
    "apply_rows",
    "apply_streamed",
    "new_slots",
    "parse_rule",
]

#: A shard's optimizer slots by name (Momentum's ``buf``, Adagrad's ``acc``, Adam's ``m`` and ``v``).
Slots = dict[str, np.ndarray]


@dataclass(frozen=True)
class UpdateRule:
    """An update rule: its wire name, the optimizer slots a shard keeps for it, and its hyperparameters (the fields
    of each subclass, with PyTorch's defaults)."""

    name: ClassVar[str]
    slot_names: ClassVar[tuple[str, ...]] = ()
    #: Decay factors, which must be below 1 (PyTorch's rule for Adam's betas; a momentum of 1 or more makes the
    #: buffer grow without bound).
    below_one: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{self.name}.{f.name} must be true or false, got {value!r}")
                continue
            try:
                number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            except OverflowError:  # an int beyond a float's range
                number = None
            if number is None or not math.isfinite(number):
                too_big = isinstance(value, int) and not isinstance(value, bool) and number is None
                shown = f"an integer of {len(str(value))} digits" if too_big else repr(value)
                raise ConfigError(f"{self.name}.{f.name} must be a finite number, got {shown}")
            if number < 0:
                raise ConfigError(f"{self.name}.{f.name} must be >= 0, got {value!r}")
            if f.name in self.below_one and number >= 1:
                raise ConfigError(f"{self.name}.{f.name} must be in [0, 1), got {value!r}")
            object.__setattr__(self, f.name, number)  # frozen: the one place it is set

    def to_json(self) -> dict[str, Any]:
        """The wire form: ``{"rule": name, **hyperparameters}``."""
        return {"rule": self.name, **dataclasses.asdict(self)}

    def apply(self, p: np.ndarray, g: np.ndarray, slots: Slots, t: int) -> None:
        """One update of ``p`` from ``g`` (``t``: the 1-based update count), written as the textbook expression but
        with every temporary in scratch (``out=``): the same operations in the same order, so the same bits as
        ``p -= lr * g / (sqrt(acc) + eps)`` and friends."""
        raise NotImplementedError


@dataclass(frozen=True)
class Sum(UpdateRule):
    """``p += g``."""

    name: ClassVar[str] = "sum"

    def apply(self, p: np.ndarray, g: np.ndarray, slots: Slots, t: int) -> None:
        np.add(p, g, out=p)


@dataclass(frozen=True)
class SGD(UpdateRule):
    """``p -= lr * g``."""

    name: ClassVar[str] = "sgd"
    lr: float = 0.01

    def apply(self, p: np.ndarray, g: np.ndarray, slots: Slots, t: int) -> None:
        t0, _ = _temps(p)
        np.subtract(p, np.multiply(g, p.dtype.type(self.lr), out=t0), out=p)


@dataclass(frozen=True)
class Momentum(UpdateRule):
    """PyTorch's SGD with momentum: ``buf = momentum * buf + g``; ``p -= lr * buf`` (``nesterov``: ``p -= lr * (g
    + momentum * buf)``)."""

    name: ClassVar[str] = "momentum"
    slot_names: ClassVar[tuple[str, ...]] = ("buf",)
    below_one: ClassVar[tuple[str, ...]] = ("momentum",)
    lr: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False

    def apply(self, p: np.ndarray, g: np.ndarray, slots: Slots, t: int) -> None:
        dt = p.dtype.type
        t0, _ = _temps(p)
        buf = slots["buf"]
        buf *= dt(self.momentum)
        buf += g
        if self.nesterov:
            np.add(g, np.multiply(buf, dt(self.momentum), out=t0), out=t0)
            np.subtract(p, np.multiply(t0, dt(self.lr), out=t0), out=p)
        else:
            np.subtract(p, np.multiply(buf, dt(self.lr), out=t0), out=p)


@dataclass(frozen=True)
class Adagrad(UpdateRule):
    """``acc += g * g``; ``p -= lr * g / (sqrt(acc) + epsilon)``, ``acc`` starting at ``initial_accumulator``."""

    name: ClassVar[str] = "adagrad"
    slot_names: ClassVar[tuple[str, ...]] = ("acc",)
    lr: float = 0.01
    initial_accumulator: float = 0.0
    epsilon: float = 1e-10

    def apply(self, p: np.ndarray, g: np.ndarray, slots: Slots, t: int) -> None:
        dt = p.dtype.type
        t0, t1 = _temps(p)
        acc = slots["acc"]
        acc += np.multiply(g, g, out=t0)
        np.multiply(g, dt(self.lr), out=t0)
        np.add(np.sqrt(acc, out=t1), dt(self.epsilon), out=t1)
        np.subtract(p, np.divide(t0, t1, out=t0), out=p)


@dataclass(frozen=True)
class Adam(UpdateRule):
    """PyTorch's Adam with bias correction, ``t`` counted per shard."""

    name: ClassVar[str] = "adam"
    slot_names: ClassVar[tuple[str, ...]] = ("m", "v")
    below_one: ClassVar[tuple[str, ...]] = ("beta1", "beta2")
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def apply(self, p: np.ndarray, g: np.ndarray, slots: Slots, t: int) -> None:
        dt = p.dtype.type
        t0, t1 = _temps(p)
        m, v = slots["m"], slots["v"]
        b1, b2 = dt(self.beta1), dt(self.beta2)
        m *= b1
        m += np.multiply(g, dt(1) - b1, out=t0)
        v *= b2
        v += np.multiply(np.multiply(g, g, out=t0), dt(1) - b2, out=t0)
        bc1 = 1.0 - self.beta1**t
        bc2 = 1.0 - self.beta2**t
        step = dt(self.lr / bc1)
        np.add(np.divide(np.sqrt(v, out=t1), dt(math.sqrt(bc2)), out=t1), dt(self.epsilon), out=t1)
        np.subtract(p, np.divide(np.multiply(m, step, out=t0), t1, out=t0), out=p)


_TYPES: dict[str, type[UpdateRule]] = {cls.name: cls for cls in (Sum, SGD, Momentum, Adagrad, Adam)}
#: rule name -> its hyperparameters and their defaults (PyTorch's).
RULES: dict[str, dict[str, float | bool]] = {
    name: {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[misc]
    for name, cls in _TYPES.items()
}


def parse_rule(rule: str | Mapping[str, Any] | UpdateRule, what: str = "the update rule") -> UpdateRule:
    """``rule`` as an :class:`UpdateRule`: a rule as it is, a name (``"sgd"``: its defaults) or the JSON form
    (``{"rule": "adam", "lr": 1e-3}``, the name in any case); ``ConfigError`` naming the problem otherwise."""
    if isinstance(rule, UpdateRule):
        return rule
    if isinstance(rule, str):
        rule = {"rule": rule}
    if not isinstance(rule, Mapping) or not isinstance(rule.get("rule"), str):
        raise ConfigError(
            f"{what} must be a rule (hora.ps.SGD(lr=0.1), ...), a rule name, or a dict with a 'rule' key, one of "
            f"{sorted(RULES)}; got {rule!r}"
        )
    name = rule["rule"].lower()
    cls = _TYPES.get(name)
    if cls is None:
        raise ConfigError(f"{what}: unknown rule {rule['rule']!r}; the rules are {', '.join(sorted(RULES))}")
    params = {k: v for k, v in rule.items() if k != "rule"}
    unknown = sorted(set(params) - set(RULES[name]))
    if unknown:
        takes = sorted(RULES[name]) or "none"
        raise ConfigError(f"{what}: rule {name!r} has no parameter {', '.join(unknown)}; it takes {takes}")
    try:
        return cls(**params)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def new_slots(rule: UpdateRule, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Slots:
    """The optimizer slots a shard keeps for ``rule`` (zeros, Adagrad's accumulator at its initial value)."""
    slots = {name: np.full(shape, 0, dtype) for name in rule.slot_names}  # written now: no page faults later
    if isinstance(rule, Adagrad) and rule.initial_accumulator:
        slots["acc"].fill(rule.initial_accumulator)
    return slots


#: Elements updated at a time: the rule's temporaries and the copy to ``out`` stay in the cache, and no temporary
#: as large as the shard is ever allocated (elementwise, so chunking changes no bit of the result).
CHUNK = 1 << 17


def apply_dense(
    rule: UpdateRule, param: np.ndarray, grad: np.ndarray, slots: Slots, t: int, out: np.ndarray | None = None
) -> None:
    """Update ``param`` in place from ``grad``; ``t`` is the 1-based count of updates of this shard (Adam).

    With ``out`` (same shape, C-contiguous), also copy the updated values there, chunk by chunk right after each is
    updated; ``out`` may be ``grad`` itself (each chunk of the gradient is used before it is overwritten).
    """
    if param.size <= CHUNK or not (
        param.flags.c_contiguous and all(v.flags.c_contiguous for v in slots.values())
    ):
        # small (nothing to chunk), or reshaping would copy: update in place
        rule.apply(param, grad, slots, t)
        if out is not None:
            np.copyto(out, param)
        return
    g = np.ascontiguousarray(grad).reshape(-1)
    o = out.reshape(-1) if out is not None else None
    deliver = None if o is None else (lambda lo, values: np.copyto(o[lo : lo + values.size], values))
    _chunked(rule, param, slots, t, lambda lo, hi: g[lo:hi], deliver)


def _chunked(
    rule: UpdateRule,
    param: np.ndarray,
    slots: Slots,
    t: int,
    chunk: Callable[[int, int], np.ndarray],
    deliver: Deliver | None,
) -> None:
    """Update contiguous ``param`` :data:`CHUNK` elements at a time from ``chunk(lo, hi)`` (the gradient's elements
    lo..hi), handing each updated chunk to ``deliver`` while it is in the cache."""
    p = param.reshape(-1)
    flat = {k: v.reshape(-1) for k, v in slots.items()}
    for lo in range(0, p.size, CHUNK):
        hi = min(lo + CHUNK, p.size)
        rule.apply(p[lo:hi], chunk(lo, hi), {k: v[lo:hi] for k, v in flat.items()}, t)
        if deliver is not None:
            deliver(lo, p[lo:hi])


#: ``fetch(offset, buf)``: fill ``buf`` with the gradient's elements from ``offset`` on; ``deliver(offset, values)``:
#: hand on updated values that start at element ``offset`` (:func:`apply_streamed`).
Fetch = Callable[[int, np.ndarray], None]
Deliver = Callable[[int, np.ndarray], None]


def apply_streamed(
    rule: UpdateRule, param: np.ndarray, slots: Slots, t: int, fetch: Fetch, deliver: Deliver | None
) -> None:
    """:func:`apply_dense` with a gradient that is not in this process: each chunk is fetched into a scratch buffer
    in the cache, updated, and its new values delivered at once (a worker's memory, :mod:`hora.ps.cma`). A fetch
    that fails leaves the chunks before it updated."""
    if param.size <= CHUNK or not (
        param.flags.c_contiguous and all(v.flags.c_contiguous for v in slots.values())
    ):
        grad = np.empty(param.shape, param.dtype)
        fetch(0, grad.reshape(-1))
        rule.apply(param, grad, slots, t)
        if deliver is not None:
            deliver(0, np.ascontiguousarray(param).reshape(-1))
        return
    buf = _scratch(param.dtype, (CHUNK,), CHUNK, 2, 1)[0]  # the pool's rows 0-1 are the rules' temporaries

    def chunk(lo: int, hi: int) -> np.ndarray:
        fetch(lo, buf[: hi - lo])
        return buf[: hi - lo]

    _chunked(rule, param, slots, t, chunk, deliver)


def apply_rows(
    rule: UpdateRule, param: np.ndarray, rows: np.ndarray, grad: np.ndarray, slots: Slots, t: int
) -> None:
    """Update the rows ``rows`` (unique, in range) of ``param`` from ``grad`` (one row each); only those rows of
    the slots change."""
    row = param.size // max(len(param), 1)
    bufs = _scratch(param.dtype, (len(rows), *param.shape[1:]), len(rows) * row, 2, 1 + len(slots))
    p = np.take(param, rows, axis=0, out=bufs[0], mode="clip")  # rows are checked; "raise" would buffer
    s = {k: np.take(v, rows, axis=0, out=b, mode="clip") for (k, v), b in zip(slots.items(), bufs[1:])}
    rule.apply(p, grad, s, t)
    param[rows] = p
    for k, v in s.items():
        slots[k][rows] = v


_local = threading.local()
#: Elements: larger updates (unchunked) allocate their temporaries instead of keeping them.
_TEMP_LIMIT = 1 << 22
_SMALL = 1 << 12  # elements
_POOL = 5  # two temporaries, then a sparse update's gathered rows and at most two slots


def _scratch(
    dtype: np.dtype[Any], shape: tuple[int, ...], size: int, first: int, count: int
) -> list[np.ndarray]:
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
