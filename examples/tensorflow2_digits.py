#!/usr/bin/python3
"""Data-parallel training of a small network on scikit-learn's bundled digits with
krug.tensorflow and a GradientTape.

    krugrun -np 2 /opt/krug/venv/bin/python examples/tensorflow2_digits.py --epochs 30

The 1797 8x8 images ship with scikit-learn (no download). They are split 80/20 once, the same
way on every rank (--seed); each epoch the training set is shuffled identically everywhere and
dealt out round-robin, padded so that every rank runs the same number of steps. Gradients are
averaged by hvd.DistributedGradientTape; rank 0's initial variables are broadcast after the
first step (so that the optimizer's exist too), as Horovod's TF2 example does. Each rank scores
its share of the held-out set and the counts are summed with hvd.allreduce. Exits 1 when the
final accuracy is below --min-accuracy (0.95).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from digits_common import epoch_shard, split, training_arguments, verdict  # noqa: E402

import krug.tensorflow as hvd  # noqa: E402


def parse_args():
    p = training_arguments(__doc__)
    return p.parse_args()


def make_model():
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def main():
    args = parse_args()
    hvd.init()
    tf.random.set_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = split(len(labels), args.seed)
    test_mine = test_idx[rank::size]

    model = make_model()
    optimizer = tf.keras.optimizers.SGD(args.lr * size, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    accuracy = 0.0
    first = True
    for epoch in range(args.epochs):
        shard = epoch_shard(train_idx, epoch, args.seed, rank, size)
        total_loss, steps = 0.0, 0
        for start in range(0, len(shard), args.batch_size):
            batch = shard[start:start + args.batch_size]
            loss = train_step(images[batch], labels[batch])
            if first:
                # After the first step the optimizer's variables exist: start from rank 0's.
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(optimizer.variables, root_rank=0)
                first = False
            total_loss += float(loss)
            steps += 1
        mean_loss = float(hvd.allreduce(tf.constant(total_loss / max(steps, 1)),
                                        name="train_loss"))
        predictions = tf.argmax(model(images[test_mine], training=False), axis=1).numpy()
        correct = float(np.sum(predictions == labels[test_mine]))
        counts = hvd.allreduce(tf.constant([correct, float(len(test_mine))], tf.float64),
                               op=hvd.Sum, name="test_counts").numpy()
        accuracy = counts[0] / counts[1]
        if rank == 0:
            print("epoch %3d  loss %.4f  held-out accuracy %.4f" % (epoch + 1, mean_loss,
                                                                     accuracy), flush=True)

    code = verdict(accuracy, args.min_accuracy, rank, size)
    hvd.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
