"""A TensorFlow ``ParameterServerStrategy`` Keras script written for SageMaker's ``parameter_server`` distribution
(``TensorFlow(..., distribution={"parameter_server": {"enabled": True}})``), run unchanged as a local job:

    hora job run examples/jobs/ps_job.yaml --wait

SageMaker's TensorFlow container (and hora job) starts a parameter server (``tf.distribute.Server``, job ``ps``)
on every host and runs this script once per host with ``TF_CONFIG`` naming the tasks ``master`` (algo-1),
``worker`` (the other hosts) and ``ps`` (every host). TensorFlow 2's ``ParameterServerStrategy`` calls the
coordinator ``chief``, so the script renames ``master``; the master coordinates the training (``model.fit``), the
other hosts serve as workers until the master is done.

Keras 3's ``fit`` does not support ``ParameterServerStrategy`` (keras-team/keras#20585), so ``tf.keras`` here is
Keras 2 (``tf_keras``), picked by ``TF_USE_LEGACY_KERAS=1`` in the job's environment (ps_job.yaml).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import numpy as np
import tensorflow as tf


def reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def serve_as_worker(cluster: tf.train.ClusterSpec, index: int, chief: str, timeout: float) -> None:
    """A worker task: serve the coordinator's functions until the chief has come and gone (its port closes)."""
    server = tf.distribute.Server(cluster, job_name="worker", task_index=index, protocol="grpc", start=True)
    print(f"worker {index} serving at {server.target}", flush=True)
    deadline = time.monotonic() + timeout
    while not reachable(chief):  # the chief opens its port when it connects to the cluster
        if time.monotonic() > deadline:
            sys.exit(f"the chief at {chief} never came up within {timeout:g}s")
        time.sleep(0.5)
    while reachable(chief):
        time.sleep(0.5)
    print(f"worker {index}: the chief is done", flush=True)


def load(channel: str) -> tuple[np.ndarray, np.ndarray]:
    """The digits, one TFRecord per row: 64 float32 pixels and the label."""
    files = sorted(os.path.join(channel, f) for f in os.listdir(channel))
    rows = np.stack([r.numpy() for r in tf.data.TFRecordDataset(files).map(lambda r: tf.io.decode_raw(r, tf.float32))])
    return rows[:, :64], rows[:, 64].astype(np.int32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=0.3)
    p.add_argument("--worker-timeout", type=float, default=300)
    p.add_argument("--model_dir", default=None)  # what the SageMaker SDK passes (an S3 URI there); unused here
    args, _ = p.parse_known_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    jobs = dict(tf_config["cluster"])
    jobs["chief"] = jobs.pop("master")  # SageMaker's name for the coordinator -> TensorFlow 2's
    task_type = {"master": "chief"}.get(tf_config["task"]["type"], tf_config["task"]["type"])
    cluster = tf.train.ClusterSpec(jobs)
    if task_type == "worker":
        serve_as_worker(cluster, tf_config["task"]["index"], jobs["chief"][0], args.worker_timeout)
        return

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type="chief", task_id=0, rpc_layer="grpc")
    # Variables over every parameter server: each layer's kernel split in as many shards as there are servers.
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256, max_shards=len(jobs["ps"]))
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)

    x, y = load(os.environ["SM_CHANNEL_TRAIN"])
    split = len(x) * 4 // 5

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(args.batch_size)
        ds = tf.data.Dataset.from_tensor_slices((x[:split], y[:split])).shuffle(split, seed=0).repeat()
        return ds.shard(context.num_input_pipelines, context.input_pipeline_id).batch(batch).prefetch(2)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile(tf.keras.optimizers.SGD(args.learning_rate),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=5)
    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=args.epochs,
                        steps_per_epoch=args.steps_per_epoch, verbose=0)
    for epoch, loss in enumerate(history.history["loss"], 1):
        print(f"epoch {epoch} loss={loss:.4f}", flush=True)

    dense = [layer for layer in model.layers if layer.weights]
    shards = {layer.name: len(getattr(layer.kernel, "variables", [layer.kernel])) for layer in dense}
    print(f"kernel shards over the parameter servers: {json.dumps(shards, sort_keys=True)}", flush=True)
    # The weights live on the parameter servers: read them back (a sharded kernel whole) and score the held-out fifth.
    weights = [tf.convert_to_tensor(w).numpy() for layer in dense for w in (layer.kernel, layer.bias)]
    hidden = np.maximum(x[split:] @ weights[0] + weights[1], 0)
    accuracy = float(np.mean(np.argmax(hidden @ weights[2] + weights[3], axis=1) == y[split:]))
    print(f"accuracy={accuracy:.4f}", flush=True)
    model_dir = os.environ.get("SM_MODEL_DIR")
    if model_dir:
        np.savez(os.path.join(model_dir, "weights.npz"), *weights)


if __name__ == "__main__":
    main()
