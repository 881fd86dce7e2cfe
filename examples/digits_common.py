"""What the digits examples share: their command line, the data split, each epoch's shard, the
network, the final verdict, and the Spark examples' driver.

The examples import it from their own folder (Python puts a script's folder on sys.path), so
each example still reads as a complete program; this module holds only what would otherwise be
written once per framework.
"""
import argparse
import sys

import numpy as np


def training_arguments(description, epochs=30, lr=0.025, lr_help=None):
    """The options every digits example takes; an example adds its own to the parser."""
    p = argparse.ArgumentParser(description=description.split("\n")[0])
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--lr", type=float, default=lr,
                   help=lr_help or "learning rate for one rank; scaled by the number of ranks")
    p.add_argument("--batch-size", type=int, default=32, help="examples per rank per step")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    return p


def split(n, seed):
    """The same deterministic 80/20 split on every rank."""
    order = np.random.RandomState(seed).permutation(n)
    cut = int(round(0.8 * n))
    return order[:cut], order[cut:]


def deal(order, rank, size):
    """This rank's round-robin share of order, padded so that every rank gets as many
    examples (as torch.utils.data.DistributedSampler does): every rank runs the same steps."""
    padded = -(-len(order) // size) * size
    order = np.concatenate([order, order[: padded - len(order)]])
    return order[rank::size]


def epoch_shard(train_idx, epoch, seed, rank, size):
    """The same shuffle of the training set on every rank, dealt out round-robin."""
    return deal(train_idx[np.random.RandomState(seed + epoch).permutation(len(train_idx))],
                rank, size)


def torch_digits_net():
    """The small convolutional network of the torch examples, on N x 1 x 8 x 8 images.

    Built from torch.nn's own layers, with no class of this module, so that Spark and Ray
    carry a model instance to their workers without importing the example there."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x8 -> 4x4
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4 -> 2x2
        nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10))


def verdict(accuracy, min_accuracy, rank, size, detail=""):
    """Rank 0 prints the final accuracy; the exit status is 1 below min_accuracy."""
    if rank == 0:
        print("final held-out accuracy %.4f with %d rank%s%s"
              % (accuracy, size, "" if size == 1 else "s", detail), flush=True)
    ok = accuracy >= min_accuracy
    if not ok and rank == 0:
        print("accuracy %.4f is below %.2f" % (accuracy, min_accuracy), file=sys.stderr)
    return 0 if ok else 1


def digits_frames(spark, seed):
    """(train, test) Spark DataFrames of the digits: a 64-float "features" array column and an
    integer "label", split 80/20 as split() does."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = (digits.images.reshape(len(digits.target), 64) / 16.0).tolist()
    train_idx, test_idx = split(len(features), seed)
    schema = "features array<double>, label long"
    rows = [(features[i], int(digits.target[i])) for i in np.concatenate([train_idx, test_idx])]
    cut = len(train_idx)
    return (spark.createDataFrame(rows[:cut], schema).repartition(2),
            spark.createDataFrame(rows[cut:], schema))


def held_out_accuracy(fitted, test_df):
    """The accuracy of a fitted krug.spark model's transform() on test_df."""
    scored = fitted.transform(test_df).select("label", "label__output").toPandas()
    predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
    return float((predicted == scored["label"].to_numpy()).mean())


def spark_main(description, app_name, train, epochs):
    """The Spark examples' command line: starts a Spark session, fits with train(spark,
    num_proc, store_path, epochs=...) -> (accuracy, model) and judges the accuracy."""
    import os
    import tempfile

    p = argparse.ArgumentParser(description=description.split("\n")[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--store", default=None, help="store path (default: a temporary directory)")
    p.add_argument("--min-accuracy", type=float, default=0.95)
    args = p.parse_args()

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this Python
    spark = (SparkSession.builder.master(args.master).appName(app_name)
             .config("spark.ui.enabled", "false")
             .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="krug-store-") as tmp:
            accuracy, _ = train(spark, args.num_proc, args.store or tmp, epochs=args.epochs)
    finally:
        spark.stop()
    return verdict(accuracy, args.min_accuracy, 0, args.num_proc)
