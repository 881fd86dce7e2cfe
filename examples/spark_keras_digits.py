#!/usr/bin/env python3
"""Trains a small Keras network on scikit-learn's digits with krug.spark.keras.KerasEstimator on a
Spark cluster, and scores the held-out 20 % with the returned model's transform().

    python3 examples/spark_keras_digits.py --master local-cluster[2,1,1024] --num-proc 2

The same data, split and store layout as examples/spark_torch_digits.py; every rank trains with
krug.keras (Horovod's horovod.keras API). Exits 1 when the held-out accuracy is below
--min-accuracy (0.95). tests/spark runs train() on the tests' cluster.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spark_torch_digits import digits_frames  # noqa: E402 - the shared data preparation


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
    scored = fitted.transform(test_df).select("label", "label__output").toPandas()
    predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
    return float((predicted == scored["label"].to_numpy()).mean()), fitted


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--store", default=None, help="store path (default: a temporary directory)")
    p.add_argument("--min-accuracy", type=float, default=0.95)
    args = p.parse_args()

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this Python
    spark = (SparkSession.builder.master(args.master).appName("krug spark_keras_digits")
             .config("spark.ui.enabled", "false")
             .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="krug-store-") as tmp:
            acc, _ = train(spark, args.num_proc, args.store or tmp, epochs=args.epochs)
    finally:
        spark.stop()
    print("final held-out accuracy %.4f with %d ranks" % (acc, args.num_proc), flush=True)
    return 0 if acc >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
