"""Keras training benchmark: hora.keras.DistributedOptimizer vs tf.distribute.MultiWorkerMirroredStrategy.

The same model (an MLP 784 -> 1024 -> 1024 -> 10, 1.9 M float32 parameters), random data of the same shape, the
same per-worker batch (``--batch-size``, default 64) and the same intra-op threads (``--threads``, default 1) for:

    hora          Keras 3 ``fit`` with ``hora.keras.DistributedOptimizer`` (TensorFlow backend), under ``hora run``
    mwms-ring     tf_keras ``fit`` under ``MultiWorkerMirroredStrategy`` with RING collectives (Keras 3 ``fit``
                  fails under MWMS: keras-team/keras#20585), ranks started by ``hora run`` with a TF_CONFIG each
    mwms-auto     the same with AUTO

Driver (default)::

    python benchmarks/keras_training.py                       # N = 2 and 4, all three, 3 rounds
    python benchmarks/keras_training.py --np 2 --json /tmp/keras_training.json
    python benchmarks/keras_training.py --smoke               # a few steps: checks that it runs

Method. Launches alternate between the frameworks round-robin (the first one rotates each round). In a launch,
``fit`` runs ``--warmup`` untimed steps and ``--steps`` timed ones; a callback stamps the end of every batch and the
median step time is kept. Samples/s per worker = batch / median step. The hora worker also measures the adapter's
overhead: the median time of its grouped allreduce of all the gradients as a graph op (inside ``tf.function``)
minus ``hora.numpy``'s grouped allreduce of the same bytes, per step (target: <= 0.3 ms). The target for training
is >= 2x MWMS's samples/s.

Worker (``--worker hora|mwms-ring|mwms-auto``): runs inside every rank and prints ``HORA_BENCH {json}`` lines from
rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

import numpy as np
from _common import emit, finish, hora_command, machine, parse_counts, run_ranks

FRAMEWORKS = {
    "hora": "hora.keras DistributedOptimizer (Keras 3 fit)",
    "mwms-ring": "MultiWorkerMirroredStrategy RING (tf_keras fit)",
    "mwms-auto": "MultiWorkerMirroredStrategy AUTO (tf_keras fit)",
}
TARGET = 2.0
LAYERS = (784, 1024, 1024, 10)


# -- workers -------------------------------------------------------------------------------------------------------
def _model(keras: Any) -> Any:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((LAYERS[0],))]
    layers += [keras.layers.Dense(w, activation="relu") for w in LAYERS[1:-1]]
    layers.append(keras.layers.Dense(LAYERS[-1]))
    return keras.Sequential(layers)


def _data(batch: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * steps, LAYERS[0])).astype(np.float32)
    y = rng.integers(0, LAYERS[-1], batch * steps).astype(np.int32)
    return x, y


class _Stamps:
    def __init__(self) -> None:
        self.times: list[float] = []

    def callback(self, keras: Any) -> Any:
        return keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: self.times.append(time.perf_counter()))

    def median_step(self, warmup: int) -> float:
        steps = np.diff(np.asarray(self.times))[warmup:]
        return float(np.median(steps))


def hora_worker(args: argparse.Namespace) -> None:
    import keras
    import tensorflow as tf

    import hora.keras as hvd
    import hora.numpy as hnp
    import hora.tensorflow as htf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    hvd.init()
    model = _model(keras)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "sparse_categorical_crossentropy")
    total = args.warmup + args.steps + 1
    x, y = _data(args.batch_size, total)
    stamps = _Stamps()
    model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), stamps.callback(keras)])  # fmt: skip
    step = stamps.median_step(args.warmup)

    # adapter overhead: the grouped allreduce of the gradients' bytes as a graph op vs hora.numpy's
    grads = [np.ones(tuple(v.shape), np.float32) for v in model.trainable_variables]
    tensors = [tf.constant(g) for g in grads]
    reduce_graph = tf.function(lambda *ts: htf.grouped_allreduce(list(ts)))
    graph_t, numpy_t = [], []
    for i in range(args.warmup + args.steps):
        hnp.barrier()
        t0 = time.perf_counter()
        reduce_graph(*tensors)
        t1 = time.perf_counter()
        hnp.barrier()
        t2 = time.perf_counter()
        hnp.grouped_allreduce(grads)
        t3 = time.perf_counter()
        if i >= args.warmup:
            graph_t.append(t1 - t0)
            numpy_t.append(t3 - t2)
    overhead = float(np.median(graph_t) - np.median(numpy_t))
    emit(hvd.rank(), {"kind": "result", "step_s": step, "overhead_s": overhead, "numpy_allreduce_s": float(np.median(numpy_t))})


def mwms_worker(args: argparse.Namespace, implementation: str) -> None:
    rank, n = int(os.environ["HORA_RANK"]), int(os.environ["HORA_SIZE"])
    ports = [int(p) for p in args.ports.split(",")]
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports[:n]]}, "task": {"type": "worker", "index": rank},
    })  # fmt: skip
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    impl = getattr(tf.distribute.experimental.CommunicationImplementation, implementation)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=impl)
    )
    keras = tf.keras
    total = args.warmup + args.steps + 1
    x, y = _data(args.batch_size * n, total)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size * n).with_options(options)
    with strategy.scope():
        model = _model(keras)
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    stamps = _Stamps()
    model.fit(data, epochs=1, verbose=0, callbacks=[stamps.callback(keras)])
    emit(rank, {"kind": "result", "step_s": stamps.median_step(args.warmup)})


def worker(args: argparse.Namespace) -> int:
    if args.worker == "hora":
        hora_worker(args)
    else:
        mwms_worker(args, args.worker.split("-")[1].upper())
    emit(int(os.environ.get("HORA_RANK", "0")), {"kind": "done"})
    return 0


# -- driver --------------------------------------------------------------------------------------------------------
def _free_ports(count: int) -> str:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ",".join(map(str, ports))


def driver(args: argparse.Namespace) -> int:
    start = time.time()
    frameworks = args.frameworks.split(",")
    notes: list[str] = []
    results: dict[str, Any] = {}
    for n in parse_counts(args.np):
        per: dict[str, list[dict[str, Any]]] = {f: [] for f in frameworks}
        for round_ in range(args.rounds):
            order = frameworks[round_ % len(frameworks) :] + frameworks[: round_ % len(frameworks)]
            for fw in order:
                cmd = [
                    *hora_command(n), sys.executable, os.path.abspath(__file__), "--worker", fw, "--steps", str(args.steps),
                    "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), "--threads",
                    str(args.threads), "--ports", _free_ports(n),
                ]  # fmt: skip
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
                recs, error = run_ranks(cmd, env, args.timeout)
                if error:
                    notes.append(f"{fw} N={n} round {round_}: {error}")
                per[fw] += [r for r in recs if r["kind"] == "result"]
        print(f"\nN={n}, per-worker batch {args.batch_size}, {args.threads} intra-op thread(s):")
        print(f"{'framework':52s} {'samples/s/worker':>16s} {'step ms':>8s}")
        summary = {}
        for fw in frameworks:
            if not per[fw]:
                continue
            step = float(np.median([r["step_s"] for r in per[fw]]))
            summary[fw] = {"samples_per_s_per_worker": args.batch_size / step, "step_ms": step * 1e3}
            print(f"{FRAMEWORKS[fw]:52s} {args.batch_size / step:16.1f} {step * 1e3:8.2f}")
        if "hora" in summary and per["hora"]:
            overhead = float(np.median([r["overhead_s"] for r in per["hora"]])) * 1e3
            summary["hora"]["adapter_overhead_ms"] = overhead
            print(f"hora adapter overhead beyond hora.numpy's grouped allreduce: {overhead:.3f} ms/step (target <= 0.3)")
            for fw in ("mwms-ring", "mwms-auto"):
                if fw in summary:
                    ratio = summary["hora"]["samples_per_s_per_worker"] / summary[fw]["samples_per_s_per_worker"]
                    print(f"hora / {fw}: {ratio:.2f}x (target >= {TARGET:g}x)")
        results[str(n)] = summary
    finish(notes, time.time() - start, args.json, {"machine": machine(), "results": results})
    return 1 if notes else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", default="2,4", help="numbers of ranks (default: 2,4)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"subset of {','.join(FRAMEWORKS)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="timed steps per launch")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per launch")
    p.add_argument("--batch-size", type=int, default=64, help="samples per worker and step")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per worker")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--smoke", action="store_true", help="N=2, one round of 3 steps: checks that it runs")
    p.add_argument("--worker", choices=list(FRAMEWORKS), help=argparse.SUPPRESS)
    p.add_argument("--ports", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.smoke:
        args.np, args.rounds, args.steps, args.warmup = "2", 1, 3, 2
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
