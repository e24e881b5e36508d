"""Parameter-server benchmark: hora.ps vs TensorFlow's ParameterServerStrategy in the same run.

Measures, for hora (``hora run -np 1 --num-ps 2``, servers as processes, TCP on loopback):

    push+pull     (over TCP, over shared memory with single copy, and through the shared segment only, each) GB/s of push_pull on a ``--size-mb`` float32 variable (default 100 MB) over 2 servers with SGD on the
                  servers; GB/s counts the bytes pushed plus the bytes pulled per second
    latency       median push_pull round trip of a 4 KB variable (one server)
    balance       max/mean of the bytes per server for a 1M x 64 embedding + dense layers over 2 and 3 servers,
                  hora's placement beside TensorFlow's round-robin of the same shards
    sparse        rows/s of pull_rows + push_rows of ``--batch-rows`` random ids in a 1M x 64 table (end to end)
    async/sync    samples/s at N=2 with one worker 3x slower (a sleep per step), async vs sync

and for TensorFlow (``--no-tf`` skips it): the same push+pull of the same bytes over 2 ps tasks (in-process gRPC
servers), a worker function reading every shard (pull) and ``assign_sub``-ing a gradient into it (push, SGD).

Driver (default)::

    python benchmarks/ps.py                        # the sizes above, 3 rounds
    python benchmarks/ps.py --smoke                # tiny sizes: checks that it runs
    python benchmarks/ps.py --load 1               # quiet, then with 1 busy foreign process, back to back

Worker (``--worker hora|slow``): runs inside ``hora run`` and prints ``HORA_BENCH {json}`` lines from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
from _common import MARKER, busy_processes, finish, machine

HERE = os.path.abspath(__file__)
PATHS = ("tcp", "shm", "segment")


# -- workers (inside hora run) -------------------------------------------------------------------------------------
def _hora_worker(args: argparse.Namespace) -> None:
    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    out: dict[str, Any] = {}
    for path in PATHS:  # shm: single copy where the kernel allows it; segment: every byte through the segment
        part = hora.ps.FixedShardsPartitioner(2)
        with hora.ps.connect(partitioner=part, shm=path != "tcp", single_copy=path == "shm") as ps:
            n = args.size_mb * (1 << 20) // 4
            rows = max(2, n // 256)
            ps.register(f"big.{path}", np.zeros((rows, 256), np.float32), rule={"rule": "sgd", "lr": 1e-3})
            grad = np.ones((rows, 256), np.float32)
            res = np.empty_like(grad)
            times = []
            for i in range(args.warmup + args.steps):
                t = time.perf_counter()
                ps.push_pull(f"big.{path}", grad, out=res)
                if i >= args.warmup:
                    times.append(time.perf_counter() - t)
            out[f"push_pull_gbps_{path}"] = 2 * grad.nbytes / statistics.median(times) / 1e9
            out["bytes"] = grad.nbytes
            small = hora.ps.FixedShardsPartitioner(1)
            ps.register(f"small.{path}", np.zeros(1024, np.float32), rule="sgd", partitioner=small)
            g = np.ones(1024, np.float32)
            lat = []
            for i in range(args.warmup + 20 * args.steps):
                t = time.perf_counter()
                ps.push_pull(f"small.{path}", g)
                if i >= args.warmup:
                    lat.append(time.perf_counter() - t)
            out[f"latency_4k_us_{path}"] = statistics.median(lat) * 1e6
            table_rows = args.table_rows
            ps.register(f"emb.{path}", np.zeros((table_rows, 64), np.float32), rule={"rule": "adagrad", "lr": 0.1})
            rng = np.random.default_rng(0)
            grads = np.ones((args.batch_rows, 64), np.float32)
            t = time.perf_counter()
            for _ in range(args.steps):
                ids = rng.integers(0, table_rows, args.batch_rows)
                ps.pull_rows(f"emb.{path}", ids)
                ps.push_rows(f"emb.{path}", ids, grads)
            out[f"sparse_rows_per_s_{path}"] = args.batch_rows * args.steps / (time.perf_counter() - t)
            out["balance_measured"] = ps.balance()
    print(MARKER + json.dumps(out), flush=True)
    hvd.shutdown()


def _slow_worker(args: argparse.Namespace) -> None:
    """N=2, worker 1 three times slower (sleep); samples/s of worker 0 plus worker 1 over the run."""
    import hora.numpy as hvd
    import hora.ps

    hvd.init()
    step = args.step_ms / 1000 * (3 if hvd.rank() == 1 else 1)
    with hora.ps.connect(consistency=args.consistency) as ps:
        ps.register("w", np.zeros((256, 256), np.float32), rule="sgd")
        g = np.ones((256, 256), np.float32)
        hvd.barrier()
        t = time.perf_counter()
        done = 0
        while time.perf_counter() - t < args.seconds:
            time.sleep(step)
            ps.push_pull("w", g)
            done += 1
        rate = done / (time.perf_counter() - t)
    total = hvd.allreduce(np.array([rate]), op=hvd.Sum)[0]
    if hvd.rank() == 0:
        print(MARKER + json.dumps({"consistency": args.consistency, "samples_per_s": float(total)}), flush=True)
    hvd.shutdown()


# -- TensorFlow ----------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tf_push_pull(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    spec = {"worker": [f"localhost:{_free_port()}"], "ps": [f"localhost:{_free_port()}" for _ in range(2)],
            "chief": [f"localhost:{_free_port()}"]}  # fmt: skip
    cluster = tf.train.ClusterSpec(spec)
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", start=True)
               for job in ("worker", "ps") for i in range(len(spec[job]))]  # fmt: skip
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    rows = max(2, args.size_mb * (1 << 20) // 4 // 256)
    with strategy.scope():
        v = tf.Variable(tf.zeros((rows, 256)))

    @tf.function
    def step() -> Any:
        total = tf.constant(0.0)
        for shard in v.variables:
            pulled = tf.identity(shard.read_value())  # ps -> worker
            grad = pulled * 0.0 + 1.0  # computed on the worker
            shard.assign_sub(1e-3 * grad)  # worker -> ps
            total += pulled[0, 0]
        return total

    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        coordinator.schedule(step)
        coordinator.join()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    del servers
    return {"push_pull_gbps": 2 * rows * 256 * 4 / statistics.median(times) / 1e9}


def _balance() -> dict[str, Any]:
    """Bytes per server, max/mean, for a 1M x 64 embedding + dense layers: hora's placement vs TensorFlow's
    round-robin, with every variable split in S (FixedShards) and with TF's MinSizePartitioner(256 KiB, S)."""
    import hora.ps as ps

    variables = {"embedding": (1_000_000, 64), "dense1/kernel": (64, 512), "dense1/bias": (512,),
                 "dense2/kernel": (512, 256), "dense2/bias": (256,), "out/kernel": (256, 1), "out/bias": (1,)}  # fmt: skip
    out: dict[str, Any] = {}
    for servers in (2, 3):
        for label, part in (("fixed", ps.FixedShardsPartitioner(servers)), ("minsize", ps.MinSizePartitioner(256 << 10, servers))):
            keys = []
            for name, shape in variables.items():
                offsets = ps.shard_offsets(shape[0], part(shape, np.float32)[0])
                row = int(np.prod(shape[1:])) * 4
                keys += [ps.ShardKey(name, i, (offsets[i + 1] - offsets[i]) * row) for i in range(len(offsets) - 1)]
            out[f"{servers}/{label}"] = {
                "hora": ps.balance(ps.place(keys, servers), servers)["max_over_mean"],
                "round_robin": ps.balance(ps.round_robin(keys, servers), servers)["max_over_mean"],
            }
    return out


# -- driver --------------------------------------------------------------------------------------------------------
def _hora_run(np_: int, num_ps: int, worker_args: list[str], timeout: float) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "hora", "run", "-np", str(np_), "--num-ps", str(num_ps), sys.executable, HERE, *worker_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    records = [json.loads(line.split(MARKER, 1)[1]) for line in proc.stdout.splitlines() if MARKER in line]
    if proc.returncode != 0 or not records:
        raise RuntimeError(f"hora run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("hora", "slow"))
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--consistency", default="async")
    parser.add_argument("--no-tf", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--load", type=int, default=0, metavar="K",
                        help="also measure everything with K foreign busy processes (after the quiet run)")  # fmt: skip
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.worker == "hora":
        return _hora_worker(args)
    if args.worker == "slow":
        return _slow_worker(args)
    if args.smoke:
        args.size_mb, args.table_rows, args.batch_rows, args.steps, args.rounds, args.seconds = 1, 10_000, 256, 3, 1, 1.0
    start = time.time()
    sizes = ["--size-mb", str(args.size_mb), "--table-rows", str(args.table_rows), "--batch-rows",
             str(args.batch_rows), "--steps", str(args.steps), "--warmup", str(args.warmup)]  # fmt: skip
    record: dict[str, Any] = {"machine": machine(), "balance": _balance(), "loads": {}}
    notes: list[str] = []
    for load in [0, args.load] if args.load else [0]:
        with busy_processes(load):
            record["loads"][str(load)] = run = _measure(args, sizes, notes)
        print(f"## {'quiet' if not load else f'with {load} busy foreign process(es)'}")
        _report(args, run)
    for case, b in record["balance"].items():
        print(f"balance {case} (servers/partitioner): hora {b['hora']:.4f}, round-robin {b['round_robin']:.4f} (max/mean)")
    finish(notes, time.time() - start, args.json, record)


def _measure(args: argparse.Namespace, sizes: list[str], notes: list[str]) -> dict[str, Any]:
    run: dict[str, Any] = {"hora": [], "tf": [], "slow": {}}
    for _ in range(args.rounds):  # interleaved, so drifts of the machine hit both
        run["hora"] += _hora_run(1, 2, ["--worker", "hora", *sizes], 600)
        if not args.no_tf:
            try:
                run["tf"].append(_tf_in_child(sizes))  # never in this process: its gRPC threads stay and busy the cores
            except Exception as exc:  # report, do not hide hora's numbers
                notes.append(f"TensorFlow ParameterServerStrategy failed: {exc!r}")
                args.no_tf = True
    for mode in ("async", "sync"):
        extra = ["--worker", "slow", "--consistency", mode, "--seconds", str(args.seconds), "--step-ms", str(args.step_ms)]
        run["slow"][mode] = _hora_run(2, 1, extra, 600)[0]["samples_per_s"]
    return run


def _report(args: argparse.Namespace, run: dict[str, Any]) -> None:
    def med(key: str) -> float:
        return statistics.median(x[key] for x in run["hora"])

    for path in PATHS:
        print(f"hora ({path}) push+pull {args.size_mb} MB over 2 servers: {med(f'push_pull_gbps_{path}'):.2f} GB/s; "
              f"4 KB push+pull {med(f'latency_4k_us_{path}'):.0f} us; sparse {med(f'sparse_rows_per_s_{path}'):.3g} rows/s")  # fmt: skip
    if run["tf"]:
        tf_gbps = statistics.median(x["push_pull_gbps"] for x in run["tf"])
        print(f"TF ParameterServerStrategy, same bytes: {tf_gbps:.2f} GB/s; hora tcp/TF = {med('push_pull_gbps_tcp') / tf_gbps:.2f}x")
    print(f"N=2, one worker 3x slower: async {run['slow']['async']:.1f} vs sync {run['slow']['sync']:.1f} "
          f"samples/s ({run['slow']['async'] / run['slow']['sync']:.2f}x)")  # fmt: skip


def _tf_in_child(sizes: list[str]) -> dict[str, Any]:
    """A round of TensorFlow in a fresh process: a gRPC cluster cannot be rebuilt in one process, and its server
    threads, which outlive it, took half a core from the driver during hora's later rounds."""
    code = (
        f"import sys, json; sys.path.insert(0, {os.path.dirname(HERE)!r}); sys.argv = ['ps.py', *{sizes!r}]; "
        "import ps, argparse; p = argparse.ArgumentParser(); [p.add_argument(a, type=int) for a in "
        "('--size-mb', '--table-rows', '--batch-rows', '--steps', '--warmup')]; "
        "print('R' + json.dumps(ps._tf_push_pull(p.parse_args(sys.argv[1:]))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    lines = [x for x in out.stdout.splitlines() if x.startswith("R{")]
    if not lines:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, Any] = json.loads(lines[-1][1:])
    return result


if __name__ == "__main__":
    main()
