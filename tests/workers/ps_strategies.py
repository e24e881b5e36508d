"""Worker functions for the one-line strategy switch: Keras ``fit`` on parameter servers, the torch hybrid mode
(sparse embeddings on the servers, dense layers on allreduce), and the errors of both."""

from __future__ import annotations

from typing import Any

import numpy as np

GLOBAL_BATCH = 32
# 2 MiB: the default partitioner (shards of >= 1 MiB) splits it over both servers
EMB_ROWS, EMB_DIM = 4096, 128


def _digits(steps: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    n = steps * GLOBAL_BATCH
    return (x[:n] / 16.0).astype(np.float32), y[:n].astype(np.int32)


def _shard(a: np.ndarray, rank: int, n: int) -> np.ndarray:
    per = GLOBAL_BATCH // n
    return a.reshape(-1, GLOBAL_BATCH, *a.shape[1:])[:, rank * per : (rank + 1) * per].reshape(
        -1, *a.shape[1:]
    )


def keras_ps_worker(steps: int) -> dict[str, Any]:
    """Keras fit with no strategy argument (the job says parameter_server, sync); then Adam with an explicit
    ``strategy=..., staleness=1``; rank 0 also trains the single-process reference with plain Keras."""
    import keras

    import hora.keras as hvd
    from hora.ps.discovery import shared_client
    from workers.keras_fit import _model

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    x, y = _digits(steps)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = _model(keras, seed=100 + me)  # different weights per rank: the servers keep worker 0's
    base = keras.optimizers.SGD(0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(base)
    model.compile(opt, loss)
    model.fit(
        _shard(x, me, n), _shard(y, me, n), batch_size=GLOBAL_BATCH // n, epochs=1, shuffle=False, verbose=0
    )
    out: dict[str, Any] = {
        "class": type(opt).__name__, "config_equal": opt.get_config() == base.get_config(),
        "iterations": int(opt.iterations.numpy()), "weights": [np.asarray(w) for w in model.get_weights()],
    }  # fmt: skip
    adam_model = _model(keras, seed=200 + me)
    adam = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), strategy="parameter_server", staleness=1)
    adam_model.compile(adam, loss)
    adam_model.fit(
        _shard(x, me, n), _shard(y, me, n), batch_size=GLOBAL_BATCH // n, epochs=1, shuffle=False, verbose=0
    )
    out["adam_finite"] = all(np.isfinite(w).all() for w in adam_model.get_weights())
    stats = shared_client().stats()
    out["adam_staleness"] = max(v for s in stats for k, v in s["staleness"].items() if "sequential_1" in k)
    out["adam_names"] = sorted(k for s in stats for k in s["staleness"] if "sequential_1" in k)
    out["explicit_allreduce"] = not hasattr(
        type(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), strategy="allreduce")), "_hora_ps"
    )
    # hybrid: the Embedding table on the servers (sync), the Dense layer on allreduce, Adagrad
    ids, targets = _embedding_data(steps)
    emb_model = _embedding_model(keras, seed=300 + me)
    hybrid = hvd.DistributedOptimizer(
        keras.optimizers.Adagrad(0.1), strategy="hybrid", ps_parameters=emb_model, consistency="sync"
    )
    emb_model.compile(hybrid, "mse")
    emb_model.fit(
        _shard(ids, me, n), _shard(targets, me, n), batch_size=GLOBAL_BATCH // n, epochs=1, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],  # the dense part starts equal: Horovod's way
    )  # fmt: skip
    out["hybrid"] = [np.asarray(w) for w in emb_model.get_weights()]
    table = emb_model.layers[0].embeddings
    out["hybrid_server_equal"] = bool(
        np.array_equal(shared_client().pull(f"keras/{table.path}"), out["hybrid"][0])
    )
    out["hybrid_on_servers"] = sorted(
        k for s in shared_client().stats() for k in s["staleness"] if "sequential_2" in k
    )
    if me == 0:  # the references: one process, plain Keras, the global batches, worker 0's initial weights
        ref = _model(keras, seed=100)
        ref.compile(keras.optimizers.SGD(0.1, momentum=0.9), loss)
        ref.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        out["reference"] = [np.asarray(w) for w in ref.get_weights()]
        out["hybrid_start"] = [np.asarray(w) for w in _embedding_model(keras, seed=300).get_weights()]
        # Keras' Adagrad on an Embedding's IndexedSlices adds each repeated id's squared gradient separately; the
        # servers sum a row's gradient first (Adagrad's definition), as a one-hot matmul's dense gradient does
        inp = keras.Input((4,), dtype="int32")
        hot = keras.layers.Lambda(lambda t: keras.ops.one_hot(t, 50))(inp)
        dense = keras.layers.Dense(3)(keras.layers.Flatten()(keras.layers.Dense(8, use_bias=False)(hot)))
        emb_ref = keras.Model(inp, dense)
        emb_ref.set_weights(out["hybrid_start"])
        emb_ref.compile(keras.optimizers.Adagrad(0.1), "mse")
        emb_ref.fit(ids, targets, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        out["hybrid_reference"] = [np.asarray(w) for w in emb_ref.get_weights()]
        out["errors"] = _keras_errors()
    hvd.shutdown()
    return out


def _embedding_model(keras: Any, seed: int) -> Any:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((4,), dtype="int32"),
        keras.layers.Embedding(50, 8),
        keras.layers.Flatten(),
        keras.layers.Dense(3),
    ])  # fmt: skip


def _embedding_data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids below 40 only: rows 40-49 are never touched."""
    rng = np.random.default_rng(7)
    n = steps * GLOBAL_BATCH
    return rng.integers(0, 40, (n, 4)).astype(np.int32), rng.standard_normal((n, 3)).astype(np.float32)


def _hybrid_net(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential()
    net.add_module("emb", torch.nn.Embedding(EMB_ROWS, EMB_DIM, sparse=True))
    net.add_module("fc", torch.nn.Linear(EMB_DIM, 3))
    return net


def _hybrid_batch(step: int, rank: int) -> tuple[Any, Any]:
    """Ids chosen so that the shard cover is needed: step 0 rank 1 alone touches the second half of the table,
    step 1 nobody does, step 2 each rank touches one half only. Rows 1000-2047 and 3000- are never touched."""
    import torch

    rng = np.random.default_rng(1000 * step + rank)
    lo_half = rng.integers(0, 1000, 6)
    hi_half = rng.integers(2048, 3000, 6)
    ids = {(0, 0): lo_half, (0, 1): np.concatenate([lo_half, hi_half]), (1, 0): lo_half, (1, 1): lo_half,
           (2, 0): hi_half, (2, 1): lo_half}[(step % 3, rank)]  # fmt: skip
    target = torch.from_numpy(rng.standard_normal((len(ids), 3)).astype(np.float32))
    return torch.from_numpy(ids.astype(np.int64)), target


def torch_hybrid_worker(steps: int, keras_steps: int = 0) -> dict[str, Any]:
    """A sparse embedding on the servers (sync) and a dense layer on allreduce, Adagrad; returns the parameters.
    With ``keras_steps``, also a Keras fit on the parameter servers (the job runs Keras on the torch backend)."""
    import torch

    import hora.torch as hvd
    from hora.ps.discovery import shared_client

    hvd.init()
    me = hvd.rank()
    net = _hybrid_net(seed=me)  # different on each rank: worker 0's embedding comes from the servers
    hvd.broadcast_parameters(
        {"fc.weight": net.fc.weight, "fc.bias": net.fc.bias}, root_rank=0
    )  # dense: Horovod's way
    base = torch.optim.Adagrad(net.parameters(), lr=0.1)
    try:
        hvd.DistributedOptimizer(base, named_parameters=net.named_parameters(), strategy="hybrid", ps_parameters=net,
                                 consistency="bounded(1)")  # fmt: skip
        bounded_error = "no error"
    except Exception as exc:
        bounded_error = f"{type(exc).__name__}: {exc}"
    opt = hvd.DistributedOptimizer(base, named_parameters=net.named_parameters(), strategy="hybrid", ps_parameters=net,
                                   consistency="sync")  # fmt: skip
    start = net.emb.weight.detach().clone()
    for step in range(steps):
        ids, target = _hybrid_batch(step, me)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(ids), target).backward()
        assert net.emb.weight.grad.is_sparse
        opt.step()
    emb = net.emb.weight.detach().numpy().copy()
    server = shared_client().pull("emb.weight")
    out = {
        "emb": emb, "fc": [net.fc.weight.detach().numpy().copy(), net.fc.bias.detach().numpy().copy()],
        "start": start.numpy(), "server_equal": bool(np.array_equal(server, emb)),
        "placement": shared_client().placement("emb.weight"), "bounded_error": bounded_error,
        "fc_on_servers": [s for s in shared_client().stats()[0]["staleness"] if s.startswith("fc")],
    }  # fmt: skip
    out["async"] = _torch_hybrid_async(steps)
    if keras_steps:
        out["keras"] = _keras_torch_backend(keras_steps)
    hvd.shutdown()
    return out


def _torch_hybrid_async(steps: int) -> dict[str, Any]:
    """The same model (named ``a.*``) under ``consistency="async"``: each push is applied on arrival, and the rows
    every worker touched are pulled back after the step's allgather; returns the local and the servers' table."""
    import torch

    import hora.torch as hvd
    from hora.ps.discovery import shared_client

    me = hvd.rank()
    holder = torch.nn.Sequential()
    holder.add_module("a", _hybrid_net(seed=10 + me))
    net = holder.a
    hvd.broadcast_parameters({"a.fc.weight": net.fc.weight, "a.fc.bias": net.fc.bias}, root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.Adagrad(holder.parameters(), lr=0.1),
                                   named_parameters=holder.named_parameters(), strategy="hybrid",
                                   ps_parameters=holder, consistency="async")  # fmt: skip
    start = net.emb.weight.detach().clone()
    for step in range(steps):
        ids, target = _hybrid_batch(step, me)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(ids), target).backward()
        opt.step()
    return {
        "emb": net.emb.weight.detach().numpy().copy(), "server": shared_client().pull("a.emb.weight"),
        "start": start.numpy(), "fc": [net.fc.weight.detach().numpy().copy(), net.fc.bias.detach().numpy().copy()],
    }  # fmt: skip


def _keras_torch_backend(steps: int) -> dict[str, Any]:
    """Keras fit with ``strategy="parameter_server"`` on the torch backend (eager), against plain Keras."""
    import keras

    import hora.keras as hvd
    from workers.keras_fit import _model

    me, n = hvd.rank(), hvd.size()
    x, y = _digits(steps)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = _model(keras, seed=100 + me)
    nesterov = keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(nesterov, strategy="parameter_server", consistency="sync")
    model.compile(opt, loss)
    model.fit(
        _shard(x, me, n), _shard(y, me, n), batch_size=GLOBAL_BATCH // n, epochs=1, shuffle=False, verbose=0
    )
    out: dict[str, Any] = {
        "backend": keras.backend.backend(),
        "weights": [np.asarray(w) for w in model.get_weights()],
    }
    if me == 0:
        ref = _model(keras, seed=100)
        ref.compile(keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), loss)
        ref.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        out["reference"] = [np.asarray(w) for w in ref.get_weights()]
    return out


def torch_hybrid_reference(steps: int, workers: int) -> dict[str, np.ndarray]:
    """One process, a dense embedding, the loss averaged over the workers' batches, plain torch Adagrad (which
    leaves untouched rows as they are, as the servers' sparse rule does)."""
    import torch

    net = _hybrid_net(seed=0)
    net.emb = torch.nn.Embedding.from_pretrained(net.emb.weight.detach().clone(), freeze=False, sparse=False)
    opt = torch.optim.Adagrad(net.parameters(), lr=0.1)
    start = net.emb.weight.detach().numpy().copy()
    for step in range(steps):
        opt.zero_grad()
        loss = sum(
            torch.nn.functional.mse_loss(net(ids), t)
            for ids, t in (_hybrid_batch(step, r) for r in range(workers))
        )
        (loss / workers).backward()
        opt.step()
    return {"emb": net.emb.weight.detach().numpy(), "fc": [net.fc.weight.detach().numpy(), net.fc.bias.detach().numpy()],
            "start": start}  # fmt: skip


def no_servers_worker() -> dict[str, str]:
    """In a job without servers: what the torch wrappers raise (the errors name the fix)."""
    import torch

    import hora.torch as hvd

    hvd.init()
    net = _hybrid_net(seed=0)
    notes = _attempts({
        "torch_hybrid": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), strategy="hybrid",
            ps_parameters=net),
        "torch_ps": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
            strategy="parameter_server"),
        "torch_hybrid_dense_model": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(net.fc.parameters(), lr=0.1), named_parameters=net.fc.named_parameters(),
            strategy="hybrid", ps_parameters=net.fc),
        "torch_rmsprop": lambda: hvd.DistributedOptimizer(
            torch.optim.RMSprop(net.parameters()), named_parameters=net.named_parameters(), strategy="hybrid",
            ps_parameters=net),
    })  # fmt: skip
    hvd.shutdown()
    return notes


def _keras_errors() -> dict[str, str]:
    """What the Keras wrapper raises for what the servers cannot do (before it needs a server)."""
    import keras

    import hora.keras as hvd

    def ps(opt: Any) -> Any:
        return hvd.DistributedOptimizer(opt, strategy="parameter_server")

    dense_only = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="dense_only")
    return _attempts({
        "keras_rmsprop": lambda: ps(keras.optimizers.RMSprop()),
        "keras_schedule": lambda: ps(keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9))),
        "keras_clipnorm": lambda: ps(keras.optimizers.Adam(clipnorm=1.0)),
        "keras_hybrid_dense_model": lambda: hvd.DistributedOptimizer(
            keras.optimizers.Adagrad(0.1), strategy="hybrid", ps_parameters=dense_only),
        **_by_the_jobs_setting(),
    })  # fmt: skip


def _by_the_jobs_setting() -> dict[str, Any]:
    """Wrappers that cannot run on servers, with no strategy argument under HORA_STRATEGY=parameter_server: each
    refuses (UnsupportedError), none silently allreduces."""
    import optax
    import tensorflow as tf

    import hora.jax as hvd_jax
    import hora.tensorflow as hvd_tf

    return {
        "tape_by_setting": lambda: hvd_tf.DistributedGradientTape(tf.GradientTape()),
        "tf1_by_setting": lambda: hvd_tf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)),
        "jax_by_setting": lambda: hvd_jax.DistributedOptimizer(optax.sgd(0.1)),
    }


def _attempts(attempts: dict[str, Any]) -> dict[str, str]:
    notes = {}
    for key, attempt in attempts.items():
        try:
            attempt()
            notes[key] = "no error"
        except Exception as exc:
            notes[key] = f"{type(exc).__name__}: {exc}"
    return notes
