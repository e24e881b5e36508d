"""``DistributedOptimizer`` (wraps an ``mx.optimizer.Optimizer``) and ``DistributedTrainer`` (a ``gluon.Trainer``),
as in ``horovod/mxnet/__init__.py``: gradients are summed over the ranks (each first divided by
``gradient_predivide_factor``) and the optimizer's gradient scale is multiplied by ``gradient_predivide_factor /
size``, so the update sees the average.

Horovod pushes one allreduce per gradient into MXNet's engine; hora submits every gradient of a step at once and
waits for them together (one negotiation, fused into few reductions), writing the results straight into the
gradient NDArrays.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from typing import Any

import mxnet as mx

from hora import _frontend as _f
from hora._frontend import ProcessSet, global_process_set
from hora._frontend.core import GroupHandle, blocking
from hora._frontend.gradients import GradientReduction, bucket_cap, buckets, describe_gradients
from hora.mxnet import bridge
from hora.mxnet.compression import Compression

__all__ = ["DistributedOptimizer", "DistributedTrainer"]

#: why MXNet has no parameter-server strategy, and what to use instead
MXNET_INSTEAD = (
    "hora has no server rules for MXNet optimizers (MXNet's own kvstore='dist_async' is its parameter server); "
    "use strategy='allreduce', or hora.torch / hora.keras for hora's parameter servers"
)


def _describe(
    what: str,
    compression: Any,
    gradient_predivide_factor: float,
    num_groups: int,
    process_set: ProcessSet,
    strategy: str | None,
) -> GradientReduction:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"{what}: num_groups must be a non-negative int, got {num_groups!r}")
    return describe_gradients(
        what,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=num_groups or None,
        compression=compression,
        process_set=process_set,
        strategy=strategy,
        instead=MXNET_INSTEAD,
    )


def _sum_into(grads: Sequence[Any], names: Sequence[str], reduction: GradientReduction, grouped: bool) -> None:
    """Sum ``grads`` over the ranks, in place, all submitted before any is waited for, each first multiplied by the
    reduction's prescale (1 / gradient_predivide_factor). With ``grouped`` and the reduction's groups they go as
    that many grouped allreduces (one per dtype within each), as Horovod's ``num_groups``; with ``grouped`` and no
    groups, in buckets of up to the ``bucket_cap`` setting (one grouped allreduce each; 0: one per gradient)."""
    hosts = [bridge.host(g, "DistributedTrainer") for g in grads]
    prescale, _post = reduction.summed()
    process_set = reduction.process_set

    def start() -> GroupHandle:
        views = [bridge.write_view(h) for h in hosts]
        if grouped and reduction.groups is None and (cap := bucket_cap()) > 0:  # buckets, as hora.torch's
            parts = buckets([v.nbytes for v in views], cap, first=cap)  # all go now: a small first one gains nothing
        elif not grouped or reduction.groups is None:
            return GroupHandle(
                [
                    _f.start_allreduce(
                        v, inplace=True, name=n, average=False, prescale_factor=prescale, process_set=process_set
                    )
                    for v, n in zip(views, names)
                ]
            )
        else:
            parts = reduction.partition(list(range(len(views))))
        handles = []
        for idx in parts:
            by_dtype: dict[Any, list[int]] = defaultdict(list)
            for i in idx:
                by_dtype[views[i].dtype].append(i)
            for members in by_dtype.values():
                g = _f.start_grouped_allreduce(
                    [views[i] for i in members],
                    inplace=True,
                    name=f"{names[members[0]]}:{names[members[-1]]}",
                    average=False,
                    prescale_factor=prescale,
                    process_set=process_set,
                )
                handles.extend(g.handles)
        return GroupHandle(handles)

    blocking(start)
    for g, h in zip(grads, hosts):
        bridge.copy_back(g, h)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps ``optimizer`` so every ``update`` first sums the gradient over the ranks (for ``mx.mod.Module`` and
    other users of ``mx.optimizer.Updater``; Gluon scripts use :class:`DistributedTrainer`)."""

    def __init__(
        self,
        optimizer: Any,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        process_set: ProcessSet = global_process_set,
        strategy: str | None = None,
    ) -> None:
        # No Optimizer.__init__: every attribute is the wrapped optimizer's (__getattr__), as in Horovod.
        self._reduction = _describe(
            "hora.mxnet.DistributedOptimizer", None, gradient_predivide_factor, num_groups, process_set, strategy
        )
        self._optimizer = optimizer
        self._optimizer.rescale_grad *= self._reduction.summed()[1]  # gradient_predivide_factor / size
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._process_set = process_set

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") or item == "_optimizer":
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    def create_state(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index: Any, grad: Any) -> None:
        if self._process_set.size() == 1:
            return
        if isinstance(index, (tuple, list)):
            _sum_into(list(grad), [str(i) for i in index], self._reduction, grouped=True)
        else:
            _sum_into([grad], [str(index)], self._reduction, grouped=False)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        if self._process_set.included():
            self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        if self._process_set.included():
            self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: Any) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: Any) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` whose ``step`` (and ``allreduce_grads``) sums every gradient over the ranks before the
    update. ``gradient_predivide_factor`` divides each gradient before the sum (the rest of the averaging happens
    in the optimizer's gradient scale); ``prefix`` goes before each gradient's name, so two trainers in one script
    keep their collectives apart; ``compression`` (``Compression.fp16``) halves the bytes sent; ``num_groups`` > 0
    sends the gradients as that many grouped allreduces."""

    def __init__(
        self,
        params: Any,
        optimizer: Any,
        optimizer_params: Any = None,
        compression: Any = Compression.none,
        gradient_predivide_factor: float = 1.0,
        prefix: str | None = None,
        num_groups: int = 0,
        process_set: ProcessSet = global_process_set,
        strategy: str | None = None,
    ) -> None:
        self._reduction = _describe(
            "hora.mxnet.DistributedTrainer", compression, gradient_predivide_factor, num_groups, process_set, strategy
        )
        self._compression = compression
        self._process_set = process_set
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn(
                "DistributedTrainer does not take DistributedOptimizer as its optimizer. We have unwrapped it for you.",
                stacklevel=2,
            )
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"DistributedTrainer: prefix must be a str or None, got {type(prefix).__name__}")
        # The same parameter order on every rank: gluon.Trainer sorts a dict or ParameterDict by key. (Horovod also
        # sorts a list of Parameters, which MXNet 1.x Parameters cannot be: hora keeps the list's order.)
        if isinstance(params, dict):
            params = OrderedDict(params)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        # Trainer.step sets the optimizer's rescale_grad to _scale / batch_size: dividing _scale by the number of
        # ranks makes the summed gradient an average.
        self._scale *= self._reduction.summed()[1]  # gradient_predivide_factor / size
        self._gradient_predivide_factor = gradient_predivide_factor
        self._prefix = prefix or ""
        self._num_groups = num_groups

    def _allreduce_grads(self) -> None:
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        grads, names, pairs = [], [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                compressed, ctx = self._compression.compress(param.list_grad()[0])
                grads.append(compressed)
                names.append(self._prefix + str(i))
                pairs.append((param, compressed, ctx))
        _sum_into(grads, names, self._reduction, grouped=True)
        if self._compression is not Compression.none:
            for param, compressed, ctx in pairs:
                param.list_grad()[0][:] = self._compression.decompress(compressed, ctx)
