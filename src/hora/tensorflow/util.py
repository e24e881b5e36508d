"""Horovod's ``horovod.tensorflow.util`` helpers that scripts use."""

from __future__ import annotations

from typing import Any

from hora.tensorflow.bridge import executing_eagerly

__all__ = ["refs_to_vars", "vars_to_refs"]


def _executing_eagerly() -> bool:
    """True when TensorFlow executes eagerly here (not while building a ``tf.function`` or a v1 graph)."""
    return executing_eagerly()


def vars_to_refs(vars: Any) -> Any:
    """Hashable references of (a structure of) variables; Keras 3 variables, which have no ``ref()``, are their
    own reference (compared by identity)."""
    if isinstance(vars, (list, tuple)):
        return type(vars)(vars_to_refs(v) for v in vars)
    return vars.ref() if hasattr(vars, "ref") else vars


def refs_to_vars(refs: Any) -> Any:
    if isinstance(refs, (list, tuple)):
        return type(refs)(refs_to_vars(r) for r in refs)
    return refs.deref() if hasattr(refs, "deref") else refs
