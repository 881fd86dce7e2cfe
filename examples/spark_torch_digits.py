#!/usr/bin/env python3
"""Trains a small network on scikit-learn's digits with krug.spark.torch.TorchEstimator on a
Spark cluster, and scores the held-out 20 % with the returned model's transform().

    python3 examples/spark_torch_digits.py --master local-cluster[2,1,1024] --num-proc 2

The DataFrame has a 64-float "features" array column and an integer "label"; fit() writes it as
Parquet into the store (--store, a local path or any fsspec URL) and trains --num-proc krug ranks
in Spark tasks; checkpoints and the history land in the store too. Exits 1 when the held-out
accuracy is below --min-accuracy (0.95). tests/spark runs train() on the tests' cluster.
"""
import sys

import torch.nn.functional as F
from digits_common import digits_frames, held_out_accuracy, spark_main, torch_digits_net


def train(spark, num_proc, store_path, epochs=30, seed=42, verbose=1):
    """Fits the estimator; returns (held-out accuracy, fitted TorchModel)."""
    import torch

    from krug.spark.common.store import Store
    from krug.spark.torch import TorchEstimator

    torch.manual_seed(seed)
    model = torch_digits_net()
    estimator = TorchEstimator(
        num_proc=num_proc, model=model, store=Store.create(store_path),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.015 * num_proc, momentum=0.9),
        loss=F.cross_entropy, metrics=[accuracy], feature_cols=["features"],
        label_cols=["label"], input_shapes=[[1, 8, 8]], validation=0.1, batch_size=32,
        epochs=epochs, random_seed=seed, verbose=verbose)
    train_df, test_df = digits_frames(spark, seed)
    fitted = estimator.fit(train_df)
    return held_out_accuracy(fitted, test_df), fitted


def accuracy(outputs, labels):
    return (outputs.argmax(dim=1) == labels).float().mean()


def main():
    return spark_main(__doc__, "krug spark_torch_digits", train, epochs=30)


if __name__ == "__main__":
    sys.exit(main())
