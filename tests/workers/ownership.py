"""Worker functions for the result-ownership tests: every value hora hands back must own its memory (or keep alive
what it views), so it reads the same after later collectives overwrite hora's buffers, after ``shutdown()`` unmaps
them and after a re-``init()`` maps new ones.

Each rank records what every op returned, runs more collectives that reuse every staging buffer, shuts down, starts
again, runs more, shuts down once more, and only then compares the kept results with values computed independently
(each rank can rebuild every other rank's input from its rank) and prints them with ``repr`` (the crash of issue 13
was a SIGSEGV inside numpy's repr of an array over released memory).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

import numpy as np

#: One size below and one above the engine's small-message path, so both the direct and the staged copies run.
SIZES = (7, 300_003)
BIG = 3_000_000  # float32 per rank: a 24-36 MiB allgather result at N=2-3


def _input(rank: int, n: int, salt: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 97) + 1000.0 * rank + salt


def _views_mapping(arr: np.ndarray) -> bool:
    """True when ``arr``'s memory belongs to an ``mmap`` somewhere down its ``base`` chain."""
    base: Any = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def _expected(size: int, salt: int) -> dict[str, Callable[[int], np.ndarray]]:
    """What each op must have returned on rank ``me`` for inputs made with ``salt``."""
    def every(n: int) -> list[np.ndarray]:
        return [_input(r, n, salt) for r in range(size)]

    def scatter_part(n: int, me: int) -> np.ndarray:
        total = np.sum(every(n), axis=0)
        counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
        start = sum(counts[:me])
        return total[start : start + counts[me]]

    def alltoall(n: int, me: int) -> np.ndarray:
        rows = n - n % size
        return np.concatenate([_input(r, n, salt)[:rows].reshape(size, -1)[me] for r in range(size)])

    out: dict[str, Callable[[int], np.ndarray]] = {}
    for n in SIZES:
        out[f"allreduce{n}"] = lambda me, n=n: np.sum(every(n), axis=0) / size
        out[f"allreduce_async{n}"] = lambda me, n=n: np.sum(every(n), axis=0)
        out[f"grouped{n}"] = lambda me, n=n: np.sum(every(n), axis=0)
        out[f"allgather{n}"] = lambda me, n=n: np.concatenate(every(n))
        out[f"grouped_allgather{n}"] = lambda me, n=n: np.concatenate(every(n))
        out[f"broadcast{n}"] = lambda me, n=n: _input(size - 1, n, salt)
        out[f"reducescatter{n}"] = lambda me, n=n: scatter_part(n, me)
        out[f"alltoall{n}"] = lambda me, n=n: alltoall(n, me)
    return out


def _expected_big(size: int, salt: int) -> np.ndarray:
    return np.concatenate([_input(r, BIG, salt) for r in range(size)])


def _numpy_round(hvd: Any, salt: int) -> dict[str, Any]:
    me, size = hvd.rank(), hvd.size()
    got: dict[str, Any] = {}
    for n in SIZES:
        x = _input(me, n, salt)
        got[f"allreduce{n}"] = hvd.allreduce(x, name=f"ar{n}")
        got[f"allreduce_async{n}"] = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name=f"ara{n}"))
        got[f"grouped{n}"] = hvd.grouped_allreduce([x, x], op=hvd.Sum, name=f"g{n}")[1]
        got[f"allgather{n}"] = hvd.allgather(x, name=f"ag{n}")
        got[f"grouped_allgather{n}"] = hvd.grouped_allgather([x], name=f"gag{n}")[0]
        got[f"broadcast{n}"] = hvd.broadcast(x, root_rank=size - 1, name=f"b{n}")
        got[f"reducescatter{n}"] = hvd.reducescatter(x, op=hvd.Sum, name=f"rs{n}")
        rows = n - n % size
        got[f"alltoall{n}"] = hvd.alltoall(x[:rows], name=f"a2a{n}")
    # Above the size whose memory is recycled once dropped (hora._engine.outputs): a kept result must not be reused.
    got["allgather_big"] = hvd.allgather(_input(me, BIG, salt), name="agbig")
    got["object"] = hvd.broadcast_object({"salt": salt, "a": np.arange(3) + salt}, root_rank=0)
    got["objects"] = hvd.allgather_object(np.full(2, me + salt))
    return got


def _check(name: str, value: Any, want: np.ndarray) -> None:
    arr = np.asarray(value)
    assert not _views_mapping(arr), f"{name}: the result views a memory mapping hora owns"
    np.testing.assert_allclose(arr.astype(np.float64), want.astype(np.float64), rtol=1e-6, err_msg=name)
    repr(arr)


def numpy_worker() -> bool:
    import hora.numpy as hvd

    hvd.init()
    first = _numpy_round(hvd, salt=1)
    _numpy_round(hvd, salt=2)  # the same names and sizes again: every buffer is reused with other values
    size, me = hvd.size(), hvd.rank()
    hvd.shutdown()
    hvd.init()
    second = _numpy_round(hvd, salt=3)
    _numpy_round(hvd, salt=4)
    hvd.shutdown()
    for kept, salt in ((first, 1), (second, 3)):
        for name, want in _expected(size, salt).items():
            _check(f"{name} (salt {salt})", kept[name], want(me))
        _check(f"allgather_big (salt {salt})", kept["allgather_big"], _expected_big(size, salt))
        assert kept["object"]["salt"] == salt and list(kept["object"]["a"]) == [salt, salt + 1, salt + 2]
        assert [int(o[0]) for o in kept["objects"]] == [r + salt for r in range(size)]
        repr(kept)
    return True


def _torch_round(hvd: Any, torch: Any, salt: int) -> dict[str, Any]:
    me, size = hvd.rank(), hvd.size()
    got: dict[str, Any] = {}
    for n in SIZES:
        x = torch.from_numpy(_input(me, n, salt))
        got[f"allreduce{n}"] = hvd.allreduce(x, name=f"ar{n}")
        got[f"allreduce_async{n}"] = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name=f"ara{n}"))
        got[f"grouped{n}"] = hvd.grouped_allreduce([x, x], op=hvd.Sum, name=f"g{n}")[1]
        got[f"allgather{n}"] = hvd.allgather(x, name=f"ag{n}")
        got[f"grouped_allgather{n}"] = hvd.grouped_allgather([x], name=f"gag{n}")[0]
        got[f"broadcast{n}"] = hvd.broadcast(x, root_rank=size - 1, name=f"b{n}")
        got[f"reducescatter{n}"] = hvd.reducescatter(x, op=hvd.Sum, name=f"rs{n}")
        rows = n - n % size
        got[f"alltoall{n}"] = hvd.alltoall(x[:rows].clone(), name=f"a2a{n}")
        # Gradients come back through the same paths.
        leaf = x.clone().requires_grad_(True)
        hvd.allreduce(leaf, op=hvd.Sum, name=f"grad{n}").sum().backward()
        got[f"grad{n}"] = leaf.grad
    got["object"] = hvd.broadcast_object({"salt": salt, "t": torch.arange(3) + salt}, root_rank=0)
    got["objects"] = hvd.allgather_object(torch.full((2,), me + salt))
    return got


def torch_worker() -> bool:
    import torch

    import hora.torch as hvd

    hvd.init()
    first = _torch_round(hvd, torch, salt=1)
    _torch_round(hvd, torch, salt=2)
    size, me = hvd.size(), hvd.rank()
    hvd.shutdown()
    hvd.init()
    second = _torch_round(hvd, torch, salt=3)
    _torch_round(hvd, torch, salt=4)
    hvd.shutdown()
    for kept, salt in ((first, 1), (second, 3)):
        for name, want in _expected(size, salt).items():
            _check(f"torch {name} (salt {salt})", kept[name].numpy(), want(me))
        for n in SIZES:
            _check(f"torch grad{n} (salt {salt})", kept[f"grad{n}"].numpy(), np.full(n, float(size), np.float32))
        assert kept["object"]["salt"] == salt and kept["object"]["t"].tolist() == [salt, salt + 1, salt + 2]
        assert [int(o[0]) for o in kept["objects"]] == [r + salt for r in range(size)]
        repr(kept)
    return True
