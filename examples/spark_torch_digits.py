#!/usr/bin/env python3
"""Trains a small network on scikit-learn's digits with krug.spark.torch.TorchEstimator on a
Spark cluster, and scores the held-out 20 % with the returned model's transform().

    python3 examples/spark_torch_digits.py --master local-cluster[2,1,1024] --num-proc 2

The DataFrame has a 64-float "features" array column and an integer "label"; fit() writes it as
Parquet into the store (--store, a local path or any fsspec URL) and trains --num-proc krug ranks
in Spark tasks; checkpoints and the history land in the store too. Exits 1 when the held-out
accuracy is below --min-accuracy (0.95). tests/spark runs train() on the tests' cluster.
"""
import argparse
import sys
import tempfile

import numpy as np
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


def digits_frames(spark, seed):
    """(train, test) DataFrames: the same 80/20 split as examples/torch_digits.py."""
    digits = load_digits()
    features = (digits.images.reshape(len(digits.target), 64) / 16.0).tolist()
    order = np.random.RandomState(seed).permutation(len(features))
    cut = int(round(0.8 * len(order)))
    rows = [(features[i], int(digits.target[i])) for i in order]
    schema = "features array<double>, label long"
    return (spark.createDataFrame(rows[:cut], schema).repartition(2),
            spark.createDataFrame(rows[cut:], schema))


class Net(nn.Module):
    """examples/torch_digits.py's network: the 64 features are the 8x8 image (input_shapes)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def train(spark, num_proc, store_path, epochs=30, seed=42, verbose=1):
    """Fits the estimator; returns (held-out accuracy, fitted TorchModel)."""
    import torch

    from krug.spark.common.store import Store
    from krug.spark.torch import TorchEstimator

    torch.manual_seed(seed)
    model = Net()
    estimator = TorchEstimator(
        num_proc=num_proc, model=model, store=Store.create(store_path),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.015 * num_proc, momentum=0.9),
        loss=F.cross_entropy, metrics=[accuracy], feature_cols=["features"],
        label_cols=["label"], input_shapes=[[1, 8, 8]], validation=0.1, batch_size=32,
        epochs=epochs, random_seed=seed, verbose=verbose)
    train_df, test_df = digits_frames(spark, seed)
    fitted = estimator.fit(train_df)
    scored = fitted.transform(test_df).select("label", "label__output").toPandas()
    predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
    return float((predicted == scored["label"].to_numpy()).mean()), fitted


def accuracy(outputs, labels):
    return (outputs.argmax(dim=1) == labels).float().mean()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--store", default=None, help="store path (default: a temporary directory)")
    p.add_argument("--min-accuracy", type=float, default=0.95)
    args = p.parse_args()

    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this Python
    spark = (SparkSession.builder.master(args.master).appName("krug spark_torch_digits")
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
