"""A SageMaker script-mode TensorFlow Horovod script: Keras 3 fit with hora's DistributedOptimizer, its data read
from a Pipe-mode channel with ``PipeModeDataset`` (SageMaker's ``sagemaker_tensorflow`` call shape), TensorFlow's
threads taken from SM_NUM_CPUS. Run it as a local job:

    hora job run examples/jobs/tf_job.yaml --wait

A Pipe-mode FIFO has one reader, so one process per host (local rank 0) reads the channel and shares the records
with the other processes of its host.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd_tf
import hora.tensorflow.keras as hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
    args = p.parse_args()

    hvd.init()
    cpus = int(os.environ.get("SM_NUM_CPUS", "1"))
    threads = max(1, cpus // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)

    records = None
    if hvd.local_rank() == 0:
        ds = hvd_tf.PipeModeDataset("train", record_format="TFRecord")
        rows = ds.map(lambda r: tf.io.decode_raw(r, tf.float32))
        records = np.stack([r.numpy() for r in rows])
    local_root = hvd.rank() - hvd.local_rank()  # hosts' ranks are contiguous under hora run
    table = hvd.allgather_object(records if hvd.local_rank() == 0 else None)[local_root]
    x, y = table[:, :64], table[:, 64].astype(np.int32)
    split = len(x) * 4 // 5
    xt, yt = x[:split][hvd.rank() :: hvd.size()], y[:split][hvd.rank() :: hvd.size()]

    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.002 * hvd.size())),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])  # fmt: skip
    history = model.fit(xt, yt, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip
    _, accuracy = model.evaluate(x[split:], y[split:], verbose=0)
    if hvd.rank() == 0:
        print(f"loss={history.history['loss'][-1]:.4f}")
        print(f"accuracy={accuracy:.4f}")
        if args.model_dir:
            model.save(os.path.join(args.model_dir, "model.keras"))


if __name__ == "__main__":
    main()
