"""Collectives of picklable Python objects: ``broadcast_object`` and ``allgather_object``. Objects are
serialised with cloudpickle when it is installed (lambdas, local classes), as Horovod does, and travel over the
job's authenticated connections only."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from hora._frontend.movement import allgather, broadcast, broadcast_
from hora._frontend.process_set import ProcessSet, global_process_set, group_of, root_index

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle

__all__ = ["allgather_object", "broadcast_object"]


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Any:
    """Send a picklable object from ``root_rank`` to every rank; returns it everywhere."""
    group = group_of(process_set)
    me_root = group.rank == root_index(process_set, root_rank)
    base = name if name is not None else group.auto_name("broadcast_object")
    if me_root:
        payload = np.frombuffer(_pickler.dumps(obj), np.uint8)
        length = np.array([payload.size], np.int64)
    else:
        payload, length = np.empty(0, np.uint8), np.zeros(1, np.int64)
    broadcast_(length, root_rank, f"{base}.size", process_set)
    if not me_root:
        payload = np.empty(int(length[0]), np.uint8)
    data = broadcast(payload, root_rank, f"{base}.data", process_set)
    return obj if me_root else pickle.loads(data.tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> list[Any]:
    """Gather a picklable object from every rank; returns the list in rank order."""
    group = group_of(process_set)
    base = name if name is not None else group.auto_name("allgather_object")
    payload = np.frombuffer(_pickler.dumps(obj), np.uint8)
    sizes = allgather(np.array([payload.size], np.int64), f"{base}.size", process_set)
    data = allgather(payload, f"{base}.data", process_set)
    out, pos = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[pos : pos + n].tobytes()))
        pos += n
    return out
