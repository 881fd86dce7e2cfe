#!/usr/bin/python3
"""Data-parallel training on scikit-learn's bundled digits with Keras 3's model.fit and
krug.keras (Horovod's horovod.keras API).

    krugrun -np 2 /opt/krug/venv/bin/python examples/keras_digits.py --epochs 30

The 1797 8x8 images ship with scikit-learn (no download), split 80/20 the same way on every
rank (--seed); each rank trains on its round-robin share of the training set. The optimizer is
wrapped in hvd.DistributedOptimizer (gradients averaged over the ranks, learning rate scaled by
their number); the callbacks broadcast rank 0's variables after the first batch, average the
epoch's metrics over the ranks and warm the learning rate up over the first epochs. Exits 1
when the final held-out accuracy is below --min-accuracy (0.95).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from digits_common import deal, split, training_arguments, verdict  # noqa: E402

import krug.keras as hvd  # noqa: E402


def parse_args():
    p = training_arguments(__doc__)
    p.add_argument("--warmup-epochs", type=int, default=3)
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(args.seed + hvd.rank())  # rank 0's weights win the broadcast
    rank, size = hvd.rank(), hvd.size()

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = split(len(labels), args.seed)
    mine = deal(train_idx, rank, size)  # every rank runs the same number of steps per epoch

    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    lr = args.lr * size
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr,
                                                 warmup_epochs=args.warmup_epochs),
    ]
    model.fit(images[mine], labels[mine], batch_size=args.batch_size, epochs=args.epochs,
              shuffle=True, callbacks=callbacks, verbose=2 if rank == 0 else 0)

    test_mine = test_idx[rank::size]
    predictions = np.argmax(model.predict(images[test_mine], verbose=0), axis=1)
    counts = hvd.allreduce(np.array([np.sum(predictions == labels[test_mine]), len(test_mine)],
                                    dtype=np.float64), op=hvd.Sum, name="test_counts").numpy()
    accuracy = counts[0] / counts[1]
    code = verdict(accuracy, args.min_accuracy, rank, size)
    hvd.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
