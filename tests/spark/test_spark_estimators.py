"""The estimators and the Store, on the tests' local Spark cluster: TorchEstimator's digits
example trains to >= 95 % held-out, checkpoints and logs land in the store, fit_on_parquet
reuses the written data, and bad input fails before any training; then KerasEstimator's (last:
this process aborts when torch loads libraries after TensorFlow). The Keras tests need krug.keras
(Horovod's horovod.keras API) and are skipped, saying so, when this build has none."""

import importlib
import io
import json
import os
import sys

import pytest

from conftest import assert_no_stray_processes, by_value

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, EXAMPLES)
    try:
        module = importlib.import_module("spark_torch_digits")
    finally:
        sys.path.remove(EXAMPLES)
    by_value(module.__name__)
    return module


def test_digits_example_trains_to_95_percent_and_writes_the_store(spark, example, tmp_path):
    store_path = str(tmp_path / "store")
    accuracy, fitted = example.train(spark, num_proc=2, store_path=store_path, epochs=30)
    assert accuracy >= 0.95, accuracy
    history = fitted.getHistory()
    assert len(history) == 30
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert "val_loss" in history[-1] and "val_accuracy" in history[-1]
    run = fitted.getRunId()
    runs = os.path.join(store_path, "runs", run)
    assert os.path.getsize(os.path.join(runs, "checkpoint")) > 0
    with open(os.path.join(runs, "logs", "history.json")) as f:
        assert len(json.load(f)) == 30
    assert any(n.endswith(".parquet") for n in os.listdir(os.path.join(store_path,
                                                                       "train_data")))
    assert_no_stray_processes()


def test_fit_on_parquet_reuses_the_data_in_the_store(spark, example, tmp_path):
    import torch
    import torch.nn.functional as F

    from krug.spark.common.store import Store
    from krug.spark.torch import TorchEstimator

    store = Store.create(str(tmp_path / "store"))
    train_df, test_df = example.digits_frames(spark, 42)
    model = torch.nn.Sequential(torch.nn.Linear(64, 10))
    est = TorchEstimator(num_proc=2, model=model, store=store, loss=F.cross_entropy,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         feature_cols=["features"], label_cols=["label"], batch_size=64,
                         epochs=1, run_id="first", verbose=0)
    est.fit(train_df)
    again = est.copy({est.run_id: "second", est.epochs: 2}).fit_on_parquet()
    assert [h["epoch"] for h in again.getHistory()] == [0, 1]
    assert store.exists(store.get_checkpoint_path("second"))
    # Horovod's rule: the ranks train with the learning rate times their number.
    state = torch.load(io.BytesIO(store.read(store.get_checkpoint_path("second"))),
                       weights_only=False)
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [0.1 * 2]
    out = again.transform(test_df.limit(5)).collect()
    assert len(out) == 5 and len(out[0]["label__output"]) == 10


def test_bad_input_fails_before_training(spark, tmp_path):
    import torch
    import torch.nn.functional as F

    from krug.spark.common.store import Store
    from krug.spark.torch import TorchEstimator

    df = spark.createDataFrame([([0.0] * 4, 1)], "x array<double>, y long")
    model = torch.nn.Linear(4, 2)

    def estimator(store, features):
        return TorchEstimator(num_proc=2, model=model, store=store, loss=F.cross_entropy,
                              optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              feature_cols=features, label_cols=["y"], epochs=1)

    with pytest.raises(ValueError, match=r"column\(s\) features, extra not in the DataFrame"):
        estimator(Store.create(str(tmp_path)), ["features", "extra"]).fit(df)
    blocked = tmp_path / "file"
    blocked.write_text("a file where the store's directory should be")
    with pytest.raises(ValueError, match=r"store LocalStore\(.*\) cannot be written"):
        estimator(Store.create(str(blocked / "store")), ["x"]).fit(df)
    assert not (tmp_path / "train_data").exists()


# KerasEstimator -------------------------------------------------------------------------
try:
    import krug.keras  # noqa: F401
    KRUG_KERAS = None
except ImportError as e:
    from krug import _build_info
    if _build_info.tensorflow_built:
        raise  # the build has the Keras frontend: failing to import it is a failure, not a skip
    KRUG_KERAS = "krug.keras is not available in this build (%s); KerasEstimator trains with it" % e

@pytest.mark.skipif(KRUG_KERAS is not None, reason=str(KRUG_KERAS))
def test_keras_digits_example_trains_to_95_percent(spark, tmp_path):
    sys.path.insert(0, EXAMPLES)
    try:
        example = importlib.import_module("spark_keras_digits")
    finally:
        sys.path.remove(EXAMPLES)
    by_value(example.__name__)
    store_path = str(tmp_path / "store")
    accuracy, fitted = example.train(spark, num_proc=2, store_path=store_path, epochs=20)
    assert accuracy >= 0.95, accuracy
    assert len(fitted.getHistory()["loss"]) == 20
    assert os.path.getsize(os.path.join(store_path, "runs", fitted.getRunId(),
                                        "checkpoint")) > 0
    assert_no_stray_processes()


@pytest.mark.skipif(KRUG_KERAS is not None, reason=str(KRUG_KERAS))
def test_keras_estimator_rejects_a_model_that_is_not_keras(spark, tmp_path):
    from krug.spark.common.store import Store
    from krug.spark.keras import KerasEstimator

    df = spark.createDataFrame([([0.0] * 4, 1)], "x array<double>, y long")
    est = KerasEstimator(num_proc=2, model=object(), store=Store.create(str(tmp_path)),
                         optimizer="sgd", loss="mse", feature_cols=["x"], label_cols=["y"],
                         epochs=1)
    with pytest.raises(ValueError, match="model must be a keras.Model"):
        est.fit(df)


def test_store_create_takes_horovods_arguments(tmp_path):
    from krug.spark.common.store import FilesystemStore, LocalStore, Store

    local = Store.create(str(tmp_path / "s"), train_path=str(tmp_path / "t"), save_runs=False,
                         storage_options={"anon": True})
    assert isinstance(local, LocalStore)
    assert local.get_train_data_path() == str(tmp_path / "t")
    assert local.get_checkpoint_path("r") is None  # save_runs=False
    remote = Store.create("memory://krug-test/x", storage_options={}, checkpoint_filename="ck")
    assert isinstance(remote, FilesystemStore)
    assert remote.get_checkpoint_path("r") == "/krug-test/x/runs/r/ck"
    assert Store.create("dbfs:/ml/x").prefix_path == "/dbfs/ml/x"
