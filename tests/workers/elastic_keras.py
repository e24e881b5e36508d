"""An elastic Keras ``model.fit`` for the elastic launcher's tests (Horovod's keras elastic example, small): the
worker of ``--kill SLOT:EPOCH:BATCH`` SIGKILLs itself at that batch; the others go on. Rank 0 writes ``log`` (one
line per finished epoch: epoch, size) and every rank prints a digest of its final weights."""

import argparse
import hashlib
import os
import signal

import numpy as np
import tensorflow as tf

import hora.tensorflow.keras as hvd

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--kill", default="")
p.add_argument("--epochs", type=int, default=4)
args = p.parse_args()

hvd.init()
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential(
    [tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)]
)
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01, momentum=0.9))
model.compile(optimizer=opt, loss="mse")
slot = os.environ["HORA_ELASTIC_SLOT"]
kill_slot, kill_epoch, kill_batch = args.kill.split("@") if args.kill else ("", "-1", "-1")


class Kill(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if slot == kill_slot and state.epoch == int(kill_epoch) and batch == int(kill_batch):
            os.kill(os.getpid(), signal.SIGKILL)


class Log(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            with open(os.path.join(args.out, "log"), "a") as f:
                f.write(f"{state.epoch} {hvd.size()}\n")


def data():
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((64, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
callbacks = [
    Kill(),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.UpdateEpochStateCallback(state),
    Log(),
]


@hvd.elastic.run
def train(state):
    x, y = data()
    state.model.fit(
        x, y, batch_size=8, steps_per_epoch=8, epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0
    )


train(state)
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"finished rank {hvd.rank()} of {hvd.size()} epoch {state.epoch} weights {digest}", flush=True)
