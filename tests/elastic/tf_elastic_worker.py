"""An elastic krug.tensorflow worker for tests/elastic/test_elastic.py: a small Keras model
trained on scikit-learn's digits with a GradientTape loop inside ``@hvd.elastic.run``, its
model and optimizer in a ``hvd.elastic.TensorFlowKerasState``.

    krugrun --host-discovery-script ./discover.sh --min-np 2 \\
            python tests/elastic/tf_elastic_worker.py --result-file result.json

The loop, its output and the result file are digits_elastic_loop.py's. ``seen`` is a
non-trainable model variable (the Counts layer) to which every step adds how often it used each
training sample (an allreduce), in the same tf.function as the optimizer step. It is restored
and synced with the weights, so after E epochs every sample counts E exactly: a step lost or
applied twice to the model's variables would show there.
"""
import sys

import numpy as np
import tensorflow as tf
import keras

import krug.tensorflow as hvd
from digits_elastic_loop import TRAIN, digits, parse_args, report, train_epochs


class Counts(keras.layers.Layer):
    """Identity on the data; holds ``seen``, how often each training sample was trained on."""

    def build(self, input_shape):
        self.seen = self.add_weight(shape=(TRAIN,), initializer="zeros", trainable=False,
                                    name="seen")

    def call(self, x):
        return x


def main():
    args = parse_args(__doc__.split("\n")[0])
    hvd.init()
    tf.random.set_seed(args.seed)
    train_x, train_y, test_x, test_y = digits(args.seed)

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
        train_epochs(hvd, state, args,
                     lambda mine, used: train_step(train_x[mine], train_y[mine], used))

    train(state)
    accuracy = float(np.mean(np.argmax(model(test_x).numpy(), axis=1) == test_y))
    report(hvd, args, state, counts.seen.numpy(), accuracy)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
