"""An elastic krug.tensorflow worker for tests/elastic/test_elastic.py: a small Keras model
trained on scikit-learn's digits with a GradientTape loop inside ``@hvd.elastic.run``, its
model and optimizer in a ``hvd.elastic.TensorFlowKerasState``.

    krugrun --host-discovery-script ./discover.sh --min-np 2 \\
            python tests/elastic/tf_elastic_worker.py --result-file result.json

The global batch is constant (--global-batch-size, divisible by every rank count the job
takes): step k of an epoch trains on positions [k*G, (k+1)*G) of that epoch's permutation,
dealt to the ranks in equal slices, so the committed history is the same sequence of global
batches whatever the job's size and however often it is reset.

What the test checks, from rank 0's --result-file:
- ``ledger``: one [epoch, batch] per committed step, kept in the state, so a rollback rewinds
  it with the model: every step once, in order.
- ``seen``: a non-trainable model variable (the Counts layer) to which every step adds how often
  it used each training sample (an allreduce), in the same tf.function as the optimizer step.
  It is restored and synced with the weights, so after E epochs every sample counts E exactly:
  a step lost or applied twice to the model's variables would show there.
- ``loss``: the mean training loss of the last epoch (it starts at ln 10 = 2.3).
Rank 0 prints "step S trained" after every step and "step S committed" after every commit
(every --commit-every steps and at the end of each epoch): a worker killed between two commits
leaves trained steps that the survivors must roll back and train again.
"""
import argparse
import json
import sys
import time

import numpy as np
import tensorflow as tf
import keras
from sklearn.datasets import load_digits

import krug.tensorflow as hvd

TRAIN = 1440  # training samples: a multiple of 48, so every epoch uses each exactly once


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=48)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    p.add_argument("--result-file", default="")
    p.add_argument("--hold-at-step", type=int, default=0,
                   help="after this step's commit, wait (asking the driver about new hosts) "
                        "until the job has --hold-for-workers workers; 0: never")
    p.add_argument("--hold-for-workers", type=int, default=0)
    return p.parse_args()


class Counts(keras.layers.Layer):
    """Identity on the data; holds ``seen``, how often each training sample was trained on."""

    def build(self, input_shape):
        self.seen = self.add_weight(shape=(TRAIN,), initializer="zeros", trainable=False,
                                    name="seen")

    def call(self, x):
        return x


def hold(state, workers, timeout=120.0):
    """Waits until the job has `workers` workers: the test adds a host meanwhile, so the newcomer
    joins at this step however fast training runs. A new host raises HostsUpdatedInterrupt here
    on every rank (elastic.run re-forms the job and carries on after this step's commit)."""
    deadline = time.monotonic() + timeout
    while hvd.size() < workers:
        if time.monotonic() > deadline:
            raise SystemExit("no %d workers after %.0f s" % (workers, timeout))
        time.sleep(0.1)
        state.check_host_updates()


def main():
    args = parse_args()
    hvd.init()
    tf.random.set_seed(args.seed)
    digits = load_digits()
    order = np.random.RandomState(args.seed).permutation(len(digits.target))
    x = (digits.data / 16.0).astype(np.float32)
    train_x, train_y = x[order[:TRAIN]], digits.target[order[:TRAIN]]
    test_x, test_y = x[order[TRAIN:]], digits.target[order[TRAIN:]]
    steps_per_epoch = TRAIN // args.global_batch_size

    counts = Counts()
    model = keras.Sequential([keras.Input((64,)), counts, keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(args.lr, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0, ledger=[],
                                             losses=[], resets=0)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])

    @tf.function
    def train_step(xb, yb, used):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        counts.seen.assign_add(hvd.allreduce(used, op=hvd.Sum, name="seen"))
        return hvd.allreduce(loss, name="loss")

    @hvd.elastic.run
    def train(state):
        size = hvd.size()
        if args.global_batch_size % size:
            raise SystemExit("--global-batch-size %d is not divisible by %d ranks"
                             % (args.global_batch_size, size))
        per_rank = args.global_batch_size // size
        while state.epoch < args.epochs:
            perm = np.random.RandomState(args.seed + state.epoch).permutation(TRAIN)
            while state.batch < steps_per_epoch:
                start = state.batch * args.global_batch_size + hvd.rank() * per_rank
                mine = perm[start:start + per_rank]
                used = np.bincount(mine, minlength=TRAIN).astype(np.float32)
                loss = train_step(train_x[mine], train_y[mine], used)
                state.ledger.append([state.epoch, state.batch])
                state.losses.append(float(loss))
                state.batch += 1
                step = len(state.ledger)
                if hvd.rank() == 0:
                    print("step %d trained" % step, flush=True)
                if step % args.commit_every == 0:
                    state.commit()
                    if hvd.rank() == 0:
                        print("step %d committed at %.3f" % (step, time.monotonic()), flush=True)
                if step == args.hold_at_step:
                    hold(state, args.hold_for_workers)
            state.epoch += 1
            state.batch = 0
            state.commit()

    train(state)
    accuracy = float(np.mean(np.argmax(model(test_x).numpy(), axis=1) == test_y))
    if hvd.rank() == 0:
        last_epoch = state.losses[-steps_per_epoch:]
        result = {"ledger": state.ledger, "seen": counts.seen.numpy().tolist(),
                  "loss": float(np.mean(last_epoch)), "accuracy": accuracy,
                  "resets": state.resets, "ranks": hvd.size(),
                  "steps_per_epoch": steps_per_epoch}
        print("final loss %.4f, held-out accuracy %.4f, %d resets, %d ranks"
              % (result["loss"], accuracy, state.resets, hvd.size()), flush=True)
        if args.result_file:
            with open(args.result_file, "w") as f:
                json.dump(result, f)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
