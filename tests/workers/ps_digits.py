"""Convergence on scikit-learn's digits under the three consistencies (run under ``hora run -np 4 --num-ps 2``).

The model is a linear classifier trained by least squares on one-hot targets (65 x 10 weights with the bias,
split over both servers): its gradient grows with the weights, so too much staleness at a high learning rate
diverges for real (to inf/NaN) instead of saturating as a softmax would. Every worker draws its batches from its own
shard with its own seeded generator, so the modes see the same samples.

``staleness_schedule`` makes the staleness by protocol, not by timing: worker 0 is *fast*, workers 1-3 *slow*. In
each round the slow workers pull; worker 0 push_pulls fresh gradients until it has pushed ``lag`` times (``async``)
or until the server holds its pull back (``bounded(k)``: after k+1 pushes); only then does each slow worker push
as many gradients as worker 0 pushed, all computed on the values it pulled at the start of the round. The slow
workers learn both conditions from the servers' ``stats()`` (per-worker push counts, pulls waiting), so no sleep or
speed decides anything. In ``async`` worker 0 runs ``lag`` steps ahead and the servers report a staleness of
``lag``; in ``bounded(k)`` they hold it to k, and the slow gradients are k+1 instead of ``lag`` steps old.
"""

from __future__ import annotations

import time

import numpy as np

N_SERVERS = 2
BATCH = 32


def _data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.hstack([digits.data / 16.0, np.ones((len(digits.data), 1))]).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[digits.target]
    order = np.random.default_rng(0).permutation(len(x))
    n_test = len(x) // 5
    return x[order[n_test:]], y[order[n_test:]], x[order[:n_test]], digits.target[order[:n_test]]


def _grad(w, x, y):
    with np.errstate(all="ignore"):
        return (x.T @ (x @ w - y) / len(x)).astype(np.float32)


def _accuracy(w, x_test, t_test) -> float:
    if not np.all(np.isfinite(w)):
        return 0.0
    return float(((x_test @ w).argmax(1) == t_test).mean() * 100)


def _loss(w, x, y) -> float:
    with np.errstate(all="ignore"):
        return float(((x @ w - y) ** 2).sum(1).mean())


def _factor(done: int, total: int) -> np.float32:
    """Linear learning-rate decay to 0 over the run, applied to the gradient (for SGD the same as to the rate)."""
    return np.float32(max(0.0, 1.0 - done / total))


def free_running(ps, name, steps, rank, size, data, hvd):
    """Every worker push_pulls every step on its own batches; an epoch (a pass over its shard) ends with a barrier,
    as in a loop that evaluates every epoch, so one worker cannot run the whole training before another starts
    (which a loaded machine's scheduler otherwise may let happen)."""
    x, y = data[0][rank::size], data[1][rank::size]
    rng = np.random.default_rng(100 + rank)
    epoch = len(data[0]) // size // BATCH
    w = ps.pull(name)
    for step in range(steps):
        batch = rng.choice(len(x), BATCH, replace=False)
        w = ps.push_pull(name, _grad(w, x[batch], y[batch]) * _factor(step, steps))
        if (step + 1) % epoch == 0:
            hvd.allreduce(np.zeros(1), name=f"{name}.epoch")
    return w


def staleness_schedule(ps, name, pushes, lag, rank, size, data, hvd):
    """The fast/slow rounds of the module docstring, until the workers pushed ``pushes`` gradients in all."""
    x, y = data[0][rank::size], data[1][rank::size]
    rng = np.random.default_rng(100 + rank)
    total = 0
    w = ps.pull(name)
    while total < pushes:
        factor = _factor(total, pushes)
        start = _clocks(ps.stats(progress=True), name)
        hvd.allreduce(np.zeros(1), name=f"{name}.round")  # the slow workers hold this round's values
        made = 0
        if rank == 0:
            while made < lag:
                batch = rng.choice(len(x), BATCH, replace=False)
                w = ps.push_pull(name, _grad(w, x[batch], y[batch]) * factor)
                made += 1
                if min(_clocks(ps.stats(progress=True), name)[1:]) > min(start[1:]):  # the slow workers pushed: it was held back
                    break
        else:
            deadline = time.monotonic() + 120.0
            while True:  # until worker 0 is `lag` ahead or the server holds its pull back
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {rank}: worker 0 neither got {lag} pushes of '{name}' ahead nor was held back")
                stats = ps.stats(progress=True)
                ahead = _clocks(stats, name, max)[0] - start[0]  # pushed to one server, soon to the other
                if ahead >= lag or any(0 in s["waiting"].get(name, []) for s in stats):
                    break
                time.sleep(0.002)
            for _ in range(ahead):  # as many as worker 0 pushed, all on the values pulled at the round's start
                batch = rng.choice(len(x), BATCH, replace=False)
                ps.push(name, _grad(w, x[batch], y[batch]) * factor)
            made = ahead
        total += int(hvd.allreduce(np.array([made]), op=hvd.Sum, name=f"{name}.made")[0])
        w = ps.pull(name)  # every push of the round is applied (the allreduce came after them)
    return w


def _clocks(stats, name, over=min):
    """Each worker's pushes of ``name`` (the fewest, or with ``over=max`` the most, over the servers)."""
    held = [s["clocks"][name] for s in stats if name in s["clocks"]]
    return [over(c[r] for c in held) for r in range(len(held[0]))]


def digits_worker(pushes_a: int, pushes_b: int, lr_a: float, lr_b: float, lag: int, k: int) -> dict:
    """(a) sync vs free-running async at ``lr_a``; (b) at ``lr_b``: sync, and the fast/slow schedule under
    ``bounded(k)`` and under ``async`` with ``lag``. Every run of (a) sees ``pushes_a`` gradients in all, of (b) ``pushes_b``, with the learning
    rate decaying linearly to 0; a sync step averages the N gradients, so the async runs' rule has lr / N (the same
    rate per sample). Returns per run: test accuracy (points), training loss, the staleness the servers report."""
    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    data = _data()
    w0 = np.zeros((65, 10), np.float32)
    out = {}
    with hora.ps.connect(partitioner=hora.ps.FixedShardsPartitioner(N_SERVERS)) as ps:
        runs = [
            ("a.sync", "sync", lr_a), ("a.async", "async", lr_a / size),
            ("b.sync", "sync", lr_b), (f"b.bounded({k})", f"bounded({k})", lr_b / size), ("b.async", "async", lr_b / size),
        ]  # fmt: skip
        for name, consistency, lr in runs:
            ps.register(name, w0, rule={"rule": "sgd", "lr": lr}, consistency=consistency)
            if name.startswith("a.") or name == "b.sync":  # the server averages a sync step: lr per sample alike
                w = free_running(ps, name, (pushes_a if name.startswith("a.") else pushes_b) // size, rank, size, data, hvd)
                hvd.allreduce(np.zeros(1), name=f"{name}.end")
                w = ps.pull(name)
            else:
                w = staleness_schedule(ps, name, pushes_b, lag, rank, size, data, hvd)
            stats = ps.stats(progress=True)
            out[name] = {
                "accuracy": _accuracy(w, data[2], data[3]), "loss": _loss(w, data[0], data[1]),
                "accuracy_all": _accuracy(w, np.vstack([data[0], data[2]]), np.concatenate([data[1].argmax(1), data[3]])),
                "staleness": max(s["staleness"].get(name, 0) for s in stats),
                "servers": sorted({s["server"] for s in stats if name in s["clocks"]}),
            }  # fmt: skip
    hvd.shutdown()
    return out
