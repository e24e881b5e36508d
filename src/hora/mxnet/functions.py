"""``broadcast_parameters`` (Gluon ParameterDicts, with deferred initialization, and dicts of NDArrays),
``broadcast_object`` and ``allgather_object`` (``horovod/mxnet/functions.py`` and ``__init__.py``)."""

from __future__ import annotations

import types
from typing import Any

import mxnet as mx

from hora import _frontend as _f
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.core import GroupHandle, blocking
from hora.mxnet import bridge

__all__ = ["allgather_object", "broadcast_object", "broadcast_parameters"]


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None) -> None:
    """Copy ``root_rank``'s parameters to every rank, in place. ``params`` is a dict of NDArrays or of Gluon
    Parameters, or a Gluon ``ParameterDict`` (``model.collect_params()``). A Parameter whose initialization is
    deferred (shape known only after the first forward pass) is broadcast when it is initialized: its
    ``_init_impl`` is wrapped, as Horovod does. Names are ``prefix`` + the dict key, so every rank must pass the
    same keys."""
    if _f.size() == 1:  # as Horovod: nothing to do (deferred parameters are not wrapped either)
        return
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"broadcast_parameters: prefix must be a str or None, got {type(prefix).__name__}")
    prefix = prefix or ""
    if not isinstance(params, (dict, mx.gluon.ParameterDict)):
        raise ValueError(
            f"broadcast_parameters: invalid params of type {type(params).__name__}; pass a dict of NDArrays or "
            "Parameters, or a gluon ParameterDict (model.collect_params())"
        )
    tensors, names = [], []
    for key, p in sorted(params.items()):
        if isinstance(p, mx.gluon.Parameter):
            try:
                tensors.append(p.data())
            except mx.gluon.parameter.DeferredInitializationError:
                p._init_impl = types.MethodType(_broadcast_after_init(p._init_impl, root_rank, prefix + str(key)), p)
                continue
        else:
            tensors.append(p)
        names.append(prefix + str(key))
    if not tensors:
        return
    hosts = [bridge.host(t, "broadcast_parameters") for t in tensors]
    blocking(
        lambda: GroupHandle(
            [
                _f.start_broadcast(bridge.write_view(h), root_rank, inplace=True, name=n)
                for h, n in zip(hosts, names)
            ]
        )
    )
    for t, h in zip(tensors, hosts):
        bridge.copy_back(t, h)


def _broadcast_after_init(init_impl: Any, root_rank: int, name: str) -> Any:
    def wrapped_init_impl(self: Any, *args: Any, **kwargs: Any) -> None:
        init_impl(*args, **kwargs)
        data = self.data()
        host = bridge.host(data, "broadcast_parameters")
        blocking(lambda: _f.start_broadcast(bridge.write_view(host), root_rank, inplace=True, name=name))
        bridge.copy_back(data, host)

    return wrapped_init_impl


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """``root_rank``'s picklable ``obj`` on every rank (cloudpickle when installed)."""
    return _f.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    return _f.allgather_object(obj, name, process_set)
