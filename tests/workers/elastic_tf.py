"""An elastic TensorFlow custom training loop (``tf.function`` + ``DistributedGradientTape``, state in a
``TensorFlowState``) for the elastic launcher's tests: the worker of ``--kill SLOT@STEP`` SIGKILLs itself after
that step's gradient; a failure inside the ``tf.function`` reaches ``hvd.elastic.run`` as ``HorovodInternalError``.
Rank 0 writes ``log`` (step, size per finished step); every rank prints a digest of its final weights."""

import argparse
import hashlib
import os
import signal

import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--kill", default="")
p.add_argument("--steps", type=int, default=10)
args = p.parse_args()
kill_slot, _, kill_step = args.kill.partition("@")

hvd.init()
tf.keras.utils.set_random_seed(0)
w = tf.Variable(tf.random.normal((4, 1)), name="w")
b = tf.Variable(tf.zeros((1,)), name="b")
momentum = [tf.Variable(tf.zeros_like(w)), tf.Variable(tf.zeros_like(b))]
slot = os.environ["HORA_ELASTIC_SLOT"]


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, [w, b])
    for v, m, g in zip([w, b], momentum, grads):
        m.assign(0.9 * m + g)
        v.assign_sub(0.05 * m)
    return loss


state = hvd.elastic.TensorFlowState([w, b, *momentum], step=0)


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        rng = np.random.default_rng(state.step * 100 + hvd.rank())
        x = rng.standard_normal((16, 4)).astype("float32")
        if slot == kill_slot and state.step == int(kill_step):
            os.kill(os.getpid(), signal.SIGKILL)
        train_step(x, x.sum(axis=1, keepdims=True))
        if hvd.rank() == 0:
            with open(os.path.join(args.out, "log"), "a") as f:
                f.write(f"{state.step} {hvd.size()}\n")
        state.step += 1
        if state.step % 2 == 0:
            state.commit()


train(state)
digest = hashlib.sha256(w.numpy().tobytes() + b.numpy().tobytes()).hexdigest()[:16]
print(f"finished rank {hvd.rank()} of {hvd.size()} step {state.step} weights {digest}", flush=True)
