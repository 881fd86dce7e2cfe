#!/usr/bin/env python3
"""Trains a small Keras network on scikit-learn's digits with krug.spark.keras.KerasEstimator on a
Spark cluster, and scores the held-out 20 % with the returned model's transform().

    python3 examples/spark_keras_digits.py --master local-cluster[2,1,1024] --num-proc 2

The same data, split and store layout as examples/spark_torch_digits.py; every rank trains with
krug.keras (Horovod's horovod.keras API). Exits 1 when the held-out accuracy is below
--min-accuracy (0.95). tests/spark runs train() on the tests' cluster.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_common import digits_frames, held_out_accuracy, spark_main  # noqa: E402


def train(spark, num_proc, store_path, epochs=20, seed=42, verbose=0):
    """Fits the estimator; returns (held-out accuracy, fitted KerasModel)."""
    import keras

    from krug.spark.common.store import Store
    from krug.spark.keras import KerasEstimator

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    estimator = KerasEstimator(
        num_proc=num_proc, model=model, store=Store.create(store_path),
        optimizer=keras.optimizers.SGD(learning_rate=0.05 * num_proc, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], feature_cols=["features"], label_cols=["label"],
        validation=0.1, batch_size=32, epochs=epochs, random_seed=seed, verbose=verbose)
    train_df, test_df = digits_frames(spark, seed)
    fitted = estimator.fit(train_df)
    return held_out_accuracy(fitted, test_df), fitted


def main():
    return spark_main(__doc__, "krug spark_keras_digits", train, epochs=20)


if __name__ == "__main__":
    sys.exit(main())
